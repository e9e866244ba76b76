//! Plain-text tables as kubectl prints them: upper-case headers, columns padded to their widest cell and
//! separated by three spaces, no trailing spaces.

/// Renders `rows` under `headers`, each line indented by `indent` spaces.
pub fn render(headers: &[&str], rows: &[Vec<String>], indent: usize) -> String {
    let columns = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header_cells: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header_cells).chain(rows) {
        let mut line = " ".repeat(indent);
        for (i, width) in widths.iter().enumerate() {
            let cell = row.get(i).map(String::as_str).unwrap_or_default();
            line.push_str(cell);
            if i + 1 < columns {
                line.push_str(&" ".repeat(width - cell.chars().count() + 3));
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// A table of VirtualClusters: NAME, then NAMESPACE with `-A`, then `columns`; each row is its name, its
/// namespace and its other cells.
pub fn render_named(
    columns: &[&str],
    rows: Vec<(String, String, Vec<String>)>,
    all_namespaces: bool,
) -> String {
    let mut headers = vec!["NAME"];
    if all_namespaces {
        headers.push("NAMESPACE");
    }
    headers.extend(columns);
    let cells: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(name, namespace, rest)| {
            let mut cells = vec![name];
            if all_namespaces {
                cells.push(namespace);
            }
            cells.extend(rest);
            cells
        })
        .collect();
    render(&headers, &cells, 0)
}

/// `Label:` followed by the value, the values of consecutive fields aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(k, _)| k.chars().count() + 1)
        .max()
        .unwrap_or(0);
    pairs
        .iter()
        .map(|(key, value)| {
            let label = format!("{key}:");
            format!("{label:<width$}  {value}").trim_end().to_owned() + "\n"
        })
        .collect()
}

/// Shortens `text` to `max` characters, ending in `...` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    let text = text.replace('\n', " ");
    if text.chars().count() <= max {
        return text;
    }
    let kept: String = text.chars().take(max.saturating_sub(3)).collect();
    format!("{kept}...")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_like_kubectl() {
        let rows = vec![
            vec!["team-a".to_owned(), "Running".to_owned(), "5d".to_owned()],
            vec!["b".to_owned(), "Pending".to_owned(), String::new()],
        ];
        assert_eq!(
            render(&["NAME", "PHASE", "AGE"], &rows, 0),
            "NAME     PHASE     AGE\nteam-a   Running   5d\nb        Pending\n"
        );
        assert_eq!(render(&["A", "B"], &[], 2), "  A   B\n");
    }

    #[test]
    fn fields_align_their_values() {
        assert_eq!(
            fields(&[
                ("Name", "vc-1".into()),
                ("Cluster namespace", "ns".into()),
                ("Empty", String::new())
            ]),
            "Name:               vc-1\nCluster namespace:  ns\nEmpty:\n"
        );
    }

    #[test]
    fn long_cells_are_cut() {
        assert_eq!(truncate("abcdefgh", 5), "ab...");
        assert_eq!(truncate("a\nb", 5), "a b");
    }
}
