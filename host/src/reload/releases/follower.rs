//! Following the fleet's releases, prepares and canary tallies through
//! the host's coordination watch.

use super::*;

/// The releases the fleet was told to run, as the coordination watch brings
/// them: published to the reloader only when the watch is caught up, so a
/// watch that starts over never looks like every release being withdrawn.
pub struct ReleaseFollower {
    state: Mutex<Following>,
    published: watch::Sender<BTreeMap<String, Release>>,
    prepares: watch::Sender<BTreeMap<String, Prepare>>,
    tallies: watch::Sender<Tallies>,
}

/// Each member's counts of each canary: plugin name → member → report.
pub type Tallies = BTreeMap<String, BTreeMap<String, Report>>;

struct Following {
    releases: BTreeMap<String, Release>,
    prepares: BTreeMap<String, Prepare>,
    tallies: Tallies,
    rebuilding: bool,
}

impl ReleaseFollower {
    pub fn new() -> (
        Arc<ReleaseFollower>,
        watch::Receiver<BTreeMap<String, Release>>,
    ) {
        let (published, releases) = watch::channel(BTreeMap::new());
        let follower = ReleaseFollower {
            state: Mutex::new(Following {
                releases: BTreeMap::new(),
                prepares: BTreeMap::new(),
                tallies: BTreeMap::new(),
                rebuilding: true,
            }),
            published,
            prepares: watch::channel(BTreeMap::new()).0,
            tallies: watch::channel(BTreeMap::new()).0,
        };
        (Arc::new(follower), releases)
    }

    /// The pushes being prepared (`prepare.<name>`), as the watch brings them.
    pub fn prepares(&self) -> watch::Receiver<BTreeMap<String, Prepare>> {
        self.prepares.subscribe()
    }

    /// Each member's counts of each canary (`canary.<name>.<member>`).
    pub fn tallies(&self) -> watch::Receiver<Tallies> {
        self.tallies.subscribe()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Following> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn publish(&self, following: &Following) {
        if !following.rebuilding {
            // Releases first: a flip and the end of its prepare come in
            // that order, and a reader of both sees the flip no later.
            self.published.send_if_modified(|current| {
                let changed = *current != following.releases;
                if changed {
                    current.clone_from(&following.releases);
                }
                changed
            });
            self.prepares.send_if_modified(|current| {
                let changed = *current != following.prepares;
                if changed {
                    current.clone_from(&following.prepares);
                }
                changed
            });
            self.tallies.send_if_modified(|current| {
                let changed = *current != following.tallies;
                if changed {
                    current.clone_from(&following.tallies);
                }
                changed
            });
        }
    }
}

impl KeyFollower for ReleaseFollower {
    fn prefixes(&self) -> &'static [&'static str] {
        &[RELEASES, PREPARES, TALLIES]
    }

    fn apply(&self, entry: &Entry) {
        let put = entry.operation.is_put();
        let mut following = self.state();
        if let Some(name) = entry.key.strip_prefix(RELEASES) {
            let release = put
                .then(|| serde_json::from_slice::<Release>(&entry.value).ok())
                .flatten();
            match release {
                Some(release) => following.releases.insert(name.to_string(), release),
                None => following.releases.remove(name),
            };
        } else if let Some(name) = entry.key.strip_prefix(PREPARES) {
            let prepare = put
                .then(|| serde_json::from_slice::<Prepare>(&entry.value).ok())
                .flatten();
            match prepare {
                Some(prepare) => following.prepares.insert(name.to_string(), prepare),
                None => following.prepares.remove(name),
            };
        } else if let Some(rest) = entry.key.strip_prefix(TALLIES) {
            // Plugin names hold no dot; member ids may.
            let Some((name, member)) = rest.split_once('.') else {
                return;
            };
            let report = put
                .then(|| serde_json::from_slice::<Report>(&entry.value).ok())
                .flatten();
            let members = following.tallies.entry(name.to_string()).or_default();
            match report {
                Some(report) => members.insert(member.to_string(), report),
                None => members.remove(member),
            };
            if members.is_empty() {
                following.tallies.remove(name);
            }
        } else {
            return;
        }
        self.publish(&following);
    }

    fn restart(&self) {
        let mut following = self.state();
        following.releases.clear();
        following.prepares.clear();
        following.tallies.clear();
        following.rebuilding = true;
    }

    fn caught_up(&self) {
        let mut following = self.state();
        following.rebuilding = false;
        self.publish(&following);
    }
}
