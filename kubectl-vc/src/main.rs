//! `kubectl-vc`, the kubectl plugin (`kubectl vc ...`): flags, a client for the super cluster, then
//! [`kubectl_vc::run_with`]. Called as `kubectl_complete-vc` (or with `__complete`) it answers kubectl's
//! plugin completion instead. Every failure is one line on stderr and exit status 1.

use std::{io::IsTerminal, process::ExitCode};

use clap::Parser;
use kubectl_vc::{self as cli, Args, Command, Streams, completion};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    vc_runtime::clients::identify("kubectl-vc");
    let argv: Vec<_> = std::env::args_os().collect();
    if let Some(words) = completion::request(&argv) {
        print!("{}", completion::answer(&words).await);
        return ExitCode::SUCCESS;
    }
    let args = Args::parse_from(argv);
    let result = async {
        let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
        if let Command::Completion(completion) = &args.command {
            // Needs no cluster.
            return completion::script(completion.shell, &mut out);
        }
        let client = cli::client(&args.global).await?;
        let terminal = err.is_terminal();
        cli::run_with(
            &args,
            client,
            Streams::new(&mut out, &mut err, terminal),
            cli::interrupted(),
        )
        .await
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error.one_line());
            ExitCode::FAILURE
        }
    }
}
