//! `weir dlq`: dead letters, listed, replayed and purged.

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use time::OffsetDateTime;
use weir::delivery::{DeadLetters, LetterFilter, SinceError, StoredLetter, parse_since};
use weir::telemetry::plural;

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
        #[command(flatten)]
        change: Change,
    },
    /// Remove dead letters from the stream for good.
    Purge {
        #[command(flatten)]
        target: DlqTarget,
        #[command(flatten)]
        change: Change,
    },
}

/// Where the dead letters are, and which ones.
#[derive(clap::Args)]
pub struct DlqTarget {
    #[command(flatten)]
    fleet: FleetTarget,
    /// Only this tenant's dead letters (filtered by the server).
    #[arg(short, long)]
    tenant: Option<String>,
    /// Only this table's dead letters (filtered by the server).
    #[arg(short = 'T', long)]
    table: Option<String>,
    /// Only the dead letter with this dead-letter stream sequence, fetched
    /// directly (repeatable).
    #[arg(long = "seq", value_name = "SEQ")]
    sequences: Vec<u64>,
    /// Only dead letters whose reason contains this text.
    #[arg(short, long, value_name = "TEXT")]
    reason: Option<String>,
    /// Only dead letters stored since this RFC 3339 time
    /// (2026-01-31T12:00:00Z) or this long ago (30m, 2h, 1d, 1h30m).
    #[arg(long, value_name = "TIME|AGO", value_parser = since_now)]
    since: Option<OffsetDateTime>,
    /// Stop after this many matching dead letters, oldest first.
    #[arg(short = 'n', long, value_name = "N")]
    limit: Option<usize>,
}

/// How a command that changes the stream is run.
#[derive(clap::Args)]
pub struct Change {
    /// Print what would be done and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Do not ask before acting on every dead letter (without any filter);
    /// needed then when stdin is not a terminal.
    #[arg(short, long)]
    yes: bool,
}

fn since_now(text: &str) -> Result<OffsetDateTime, SinceError> {
    parse_since(text, OffsetDateTime::now_utc())
}

impl DlqTarget {
    async fn dead_letters(&self) -> anyhow::Result<(DeadLetters, LetterFilter)> {
        let (config, client) = self.fleet.connect().await?;
        let letters = DeadLetters::new(async_nats::jetstream::new(client), router_of(&config));
        let filter = LetterFilter {
            tenant: self.tenant.clone(),
            table: self.table.clone(),
            sequences: self.sequences.clone(),
            reason: self.reason.clone(),
            since: self.since,
            limit: self.limit,
        };
        Ok((letters, filter))
    }
}

impl DlqCommand {
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            DlqCommand::List { target } => {
                let (letters, filter) = target.dead_letters().await?;
                for letter in letters.list(&filter).await? {
                    println!("{}", serde_json::to_string(&letter)?);
                }
                Ok(())
            }
            DlqCommand::Replay { target, change } => {
                let (letters, filter) = target.dead_letters().await?;
                if change.dry_run {
                    let listed = letters.list(&filter).await?;
                    print_each("would replay", &listed);
                    println!(
                        "{} dead letters would be replayed (dry run: nothing changed)",
                        listed.len()
                    );
                    return Ok(());
                }
                if !confirmed("replay", &letters, &filter, change.yes).await? {
                    println!("nothing replayed");
                    return Ok(());
                }
                let replayed = letters.replay(&filter).await?;
                print_each("replayed", &replayed.rows);
                println!(
                    "{} replayed",
                    plural(replayed.rows.len(), "dead letter", "dead letters")
                );
                if !replayed.bad_lines.is_empty() {
                    let sequences: Vec<String> = replayed
                        .bad_lines
                        .iter()
                        .map(|letter| letter.sequence.to_string())
                        .collect();
                    println!(
                        "{} from the front door left as they are ({}): they never were rows; \
                         fix them and send them again, then `weir dlq purge --sequence …`",
                        plural(replayed.bad_lines.len(), "bad line", "bad lines"),
                        sequences.join(", ")
                    );
                }
                Ok(())
            }
            DlqCommand::Purge { target, change } => {
                let (letters, filter) = target.dead_letters().await?;
                if change.dry_run {
                    let listed = letters.list(&filter).await?;
                    print_each("would purge", &listed);
                    println!(
                        "{} dead letters would be purged (dry run: nothing changed)",
                        listed.len()
                    );
                    return Ok(());
                }
                if !confirmed("purge", &letters, &filter, change.yes).await? {
                    println!("nothing purged");
                    return Ok(());
                }
                let purged = letters.purge(&filter).await?;
                print_each("purged", &purged.letters);
                println!("{} dead letters purged", purged.count);
                Ok(())
            }
        }
    }
}

fn print_each(done: &str, letters: &[StoredLetter]) {
    for letter in letters {
        let again = letter
            .replay_of
            .map_or(String::new(), |of| format!(", a replay of letter {of}"));
        println!(
            "{done} dead letter {} ({}/{}{again}): {}",
            letter.sequence, letter.tenant, letter.table, letter.reason
        );
    }
}

/// Whether to `verb` what `filter` selects. Only a command without any
/// filter is asked about (it acts on the whole stream): on a terminal the
/// operator answers; otherwise it is refused unless `--yes` was given.
async fn confirmed(
    verb: &str,
    letters: &DeadLetters,
    filter: &LetterFilter,
    yes: bool,
) -> anyhow::Result<bool> {
    if yes || !filter.selects_everything() {
        return Ok(true);
    }
    let total = letters.count().await?;
    let question = match filter.limit {
        Some(limit) if (limit as u64) < total => {
            format!("{verb} the oldest {limit} of {total} dead letters? [y/N] ")
        }
        _ => format!("{verb} all {total} dead letters? [y/N] "),
    };
    anyhow::ensure!(
        std::io::stdin().is_terminal(),
        "refusing to {verb} every dead letter ({total}) without confirmation: stdin is not a terminal; \
         pass --yes, or select letters with --tenant, --table, --seq, --reason or --since"
    );
    // The prompt goes to stderr so stdout stays the command's report.
    let answer = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut stderr = std::io::stderr();
        stderr.write_all(question.as_bytes())?;
        stderr.flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        Ok(answer)
    })
    .await??;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}
