//! Sinks: the [`Sink`] trait the last step of a pipeline implements to
//! deliver rows somewhere.
//!
//! [`export_sink!`](crate::export_sink) exports an implementation. The shared
//! `types` and `host` interfaces are those of [`crate::transform`], so a
//! [`Row`](crate::Row) is one type for both worlds.

wit_bindgen::generate!({
    path: "../../wit",
    world: "weir:plugin/sink",
    pub_export_macro: true,
    export_macro_name: "export_world",
    default_bindings_module: "weir_plugin::sink",
    with: {
        "weir:plugin/types@0.2.0": crate::transform::weir::plugin::types,
        "weir:plugin/host@0.2.0": crate::transform::weir::plugin::host,
    },
});

use std::cell::RefCell;
use std::thread::LocalKey;

use crate::rows::Rows;

/// The last step of a pipeline: it delivers rows somewhere.
pub trait Sink: Sized + 'static {
    /// As for [`Transform::init`](crate::Transform::init).
    fn init(settings: String) -> Result<Self, String>;

    /// One delivery result per row of `rows`, in the same order.
    fn deliver(&mut self, rows: &Rows) -> Vec<Delivery>;
}

/// Where [`export_sink!`](crate::export_sink) keeps the instance's plugin.
#[doc(hidden)]
pub type Slot<P> = RefCell<Option<P>>;

#[doc(hidden)]
pub fn init<P: Sink>(slot: &'static LocalKey<Slot<P>>, settings: String) -> Result<(), String> {
    let plugin = P::init(settings)?;
    slot.with(|slot| *slot.borrow_mut() = Some(plugin));
    Ok(())
}

#[doc(hidden)]
pub fn run<P: Sink>(slot: &'static LocalKey<Slot<P>>, batch: Batch) -> Vec<Delivery> {
    let rows = Rows::from_batch(batch);
    slot.with(|slot| match slot.borrow_mut().as_mut() {
        Some(plugin) => plugin.deliver(&rows),
        // The host always calls `init` first; a trap tells it otherwise.
        None => panic!("weir-plugin: deliver called before init"),
    })
}

/// Exports a [`Sink`] as the plugin's `sink` world.
#[macro_export]
macro_rules! export_sink {
    ($plugin:ty) => {
        const _: () = {
            ::std::thread_local! {
                static PLUGIN: $crate::sink::Slot<$plugin> = const { ::std::cell::RefCell::new(None) };
            }
            struct Export;
            impl $crate::sink::Guest for Export {
                fn init(settings: String) -> Result<(), String> {
                    $crate::sink::init(&PLUGIN, settings)
                }
                fn deliver(
                    rows: $crate::sink::Batch,
                ) -> Vec<$crate::sink::Delivery> {
                    $crate::sink::run(&PLUGIN, rows)
                }
            }
            $crate::sink::export_world!(Export with_types_in $crate::sink);
        };
    };
}
