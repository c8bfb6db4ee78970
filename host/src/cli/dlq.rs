//! `weir dlq`: dead letters, listed and replayed.

use weir::delivery::dead_letter::{DeadLetters, LetterFilter};

use super::target::{FleetTarget, router_of};

#[derive(clap::Subcommand)]
pub enum DlqCommand {
    /// Print dead letters as JSON lines, oldest first.
    List {
        #[command(flatten)]
        target: DlqTarget,
    },
    /// Re-publish dead letters to their table's unit, then remove them.
    Replay {
        #[command(flatten)]
        target: DlqTarget,
    },
}

/// Where the dead letters are, and which ones.
#[derive(clap::Args)]
pub struct DlqTarget {
    #[command(flatten)]
    fleet: FleetTarget,
    /// Only this tenant's dead letters.
    #[arg(long)]
    tenant: Option<String>,
    /// Only this table's dead letters.
    #[arg(long)]
    table: Option<String>,
    /// Dead-letter stream sequences (repeatable); default: every match.
    #[arg(long = "seq")]
    sequences: Vec<u64>,
}

impl DlqTarget {
    async fn dead_letters(&self) -> anyhow::Result<(DeadLetters, LetterFilter)> {
        let (config, client) = self.fleet.connect().await?;
        let letters = DeadLetters::new(async_nats::jetstream::new(client), router_of(&config));
        let filter = LetterFilter {
            tenant: self.tenant.clone(),
            table: self.table.clone(),
            sequences: self.sequences.clone(),
        };
        Ok((letters, filter))
    }
}

impl DlqCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            DlqCommand::List { target } => {
                let (letters, filter) = target.dead_letters().await?;
                for (letter, _) in letters.list(&filter).await? {
                    println!("{}", serde_json::to_string(&letter)?);
                }
                Ok(())
            }
            DlqCommand::Replay { target } => {
                let (letters, filter) = target.dead_letters().await?;
                let replayed = letters.replay(&filter).await?;
                for letter in &replayed {
                    println!(
                        "replayed dead letter {} ({}/{}): {}",
                        letter.sequence, letter.tenant, letter.table, letter.reason
                    );
                }
                println!("{} dead letters replayed", replayed.len());
                Ok(())
            }
        }
    }
}
