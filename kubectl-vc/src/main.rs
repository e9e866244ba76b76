//! `kubectl-vc`, the kubectl plugin (`kubectl vc ...`): flags, a client for the super cluster, then
//! [`kubectl_vc::run`]. Every failure is one line on stderr and exit status 1.

use std::process::ExitCode;

use clap::Parser;
use kubectl_vc::{self as cli, Args};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = async {
        let client = cli::client(&args.global).await?;
        cli::run(&args, client, &mut std::io::stdout(), &mut std::io::stderr()).await
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
