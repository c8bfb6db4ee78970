//! `weir send`: an NDJSON file to a front door.

use std::path::PathBuf;

use weir::client::{SendOptions, send};

use super::target::HostTarget;

#[derive(clap::Args)]
pub struct SendArgs {
    /// The table the rows go to.
    #[arg(long)]
    table: String,
    /// The tenant's API key.
    #[arg(long, env = "WEIR_API_KEY")]
    key: String,
    #[command(flatten)]
    host: HostTarget,
    /// Rows per request.
    #[arg(long, default_value_t = 1000)]
    chunk_rows: usize,
    /// The NDJSON file.
    file: PathBuf,
}

impl SendArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let options = SendOptions {
            url: self.host.url()?,
            table: self.table,
            api_key: self.key,
            file: self.file,
            chunk_rows: self.chunk_rows,
            progress: true,
        };
        let accepted = send(&options).await?;
        println!("{accepted} rows accepted");
        Ok(())
    }
}
