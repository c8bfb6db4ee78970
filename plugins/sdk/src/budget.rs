//! Budgets: the [`Budget`] trait a per-tenant admission policy implements,
//! and the policy types it sees.
//!
//! [`export_budget!`](crate::export_budget) exports an implementation. A
//! budget is a value made by `init` and kept per instance, like a transform.

pub use crate::bindings::budget::{Admission, Decision, weir::plugin::policy::Usage};
#[doc(hidden)]
pub use crate::bindings::budget::{Guest, weir};

use crate::slot::Slot;

/// A per-tenant budget: asked once per ingest request, before anything is stored.
pub trait Budget: Sized + 'static {
    /// Called once per instance before any request, with the plugin's
    /// settings as a JSON object. An error refuses the plugin.
    fn init(settings: String) -> Result<Self, String>;

    /// Admits, throttles or rejects one request. Every host must decide alike
    /// from the same inputs (the usage is fleet-wide), so what a budget keeps
    /// in `self` must never make the answer depend on which host was asked: a
    /// cache of parsed settings is fine, a count of requests is not.
    fn admit(&mut self, request: &Admission) -> Decision;
}

/// The `admit` export: asks the instance's plugin.
#[doc(hidden)]
pub fn admit<P: Budget>(slot: &'static Slot<P>, request: Admission) -> Decision {
    crate::slot::with(slot, |plugin: &mut P| plugin.admit(&request))
}

/// Exports a [`Budget`] as the plugin's `budget` world.
#[macro_export]
macro_rules! export_budget {
    ($plugin:ty) => {
        const _: () = {
            ::std::thread_local! {
                static PLUGIN: $crate::slot::Cell<$plugin> = const { ::std::cell::RefCell::new(None) };
            }
            struct Export;
            impl $crate::bindings::budget::Guest for Export {
                fn init(settings: String) -> Result<(), String> {
                    $crate::slot::fill(&PLUGIN, <$plugin as $crate::budget::Budget>::init(settings))
                }
                fn admit(request: $crate::budget::Admission) -> $crate::budget::Decision {
                    $crate::budget::admit(&PLUGIN, request)
                }
            }
            $crate::bindings::budget::export_world!(Export with_types_in $crate::bindings::budget);
        };
    };
}
