//! Where an exported plugin lives between calls: one value per instance,
//! made by `init`, used by every later call. The export macros declare the
//! slot (a `thread_local!` in the plugin crate) and call these.

use std::cell::RefCell;
use std::thread::LocalKey;

/// What a slot holds: the instance's plugin, once `init` made it.
pub type Cell<P> = RefCell<Option<P>>;

/// A slot, as `thread_local!` declares it.
pub type Slot<P> = LocalKey<Cell<P>>;

/// Keeps what `init` made, or passes on its refusal.
pub fn fill<P: 'static>(slot: &'static Slot<P>, made: Result<P, String>) -> Result<(), String> {
    let plugin = made?;
    slot.with(|slot| *slot.borrow_mut() = Some(plugin));
    Ok(())
}

/// Runs `call` on the instance's plugin.
pub fn with<P: 'static, R>(slot: &'static Slot<P>, call: impl FnOnce(&mut P) -> R) -> R {
    slot.with(|slot| match slot.borrow_mut().as_mut() {
        Some(plugin) => call(plugin),
        // The host always calls `init` first; a trap tells it otherwise.
        None => panic!("weir-plugin: called before init"),
    })
}
