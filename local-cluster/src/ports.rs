use std::{
    collections::HashSet,
    net::TcpListener,
    sync::{Mutex, OnceLock},
};

use crate::{Error, Result};

/// A free TCP port on 127.0.0.1, never handed out twice by this process.
pub fn free_port() -> Result<u16> {
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(Default::default);
    for _ in 0..100 {
        let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(Error::io("binding a free port"))?;
        let port = listener
            .local_addr()
            .map_err(Error::io("reading a bound port"))?
            .port();
        if handed_out.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return Ok(port);
        }
    }
    Err(Error::Io {
        context: "finding a free port".into(),
        source: std::io::Error::other("no unused port after 100 attempts"),
    })
}
