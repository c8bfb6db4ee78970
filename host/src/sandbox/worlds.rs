//! How the sandbox links, instantiates and `init`s each world of
//! [`crate::world::WORLDS`]: one line per world in the `worlds!` call below
//! (its variant and the `bindgen!` module of `bindings.rs`). Calling a
//! world's own exports (`transform`, `admit`, …) is `PluginInstance`'s.

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::bindings;
use crate::world::World;

macro_rules! worlds {
    ($($variant:ident => $module:ident :: { $exports:ident, $pre:ident }),* $(,)?) => {
        /// A component linked for its world, ready to instantiate in a
        /// store holding `T` (the instance's `PluginState`).
        pub(super) enum PluginPre<T: 'static> {
            $($variant(bindings::$module::$pre<T>),)*
        }

        /// A live instance's exports, typed by its world.
        pub(super) enum Exports {
            /// Before instantiation finished.
            None,
            $($variant(bindings::$module::$exports),)*
        }

        impl<T: Send + 'static> PluginPre<T> {
            /// Checks the linked component against `world`'s exports.
            pub(super) fn new(
                world: World,
                pre: InstancePre<T>,
            ) -> wasmtime::Result<PluginPre<T>> {
                Ok(match world {
                    $(World::$variant => PluginPre::$variant(bindings::$module::$pre::new(pre)?),)*
                })
            }

            pub(super) async fn instantiate(
                &self,
                store: &mut Store<T>,
            ) -> wasmtime::Result<Exports> {
                Ok(match self {
                    $(PluginPre::$variant(pre) => Exports::$variant(pre.instantiate_async(store).await?),)*
                })
            }
        }

        impl Exports {
            /// Every world exports `init(settings) -> result<_, string>`.
            pub(super) async fn call_init<T: Send>(
                &self,
                store: &mut Store<T>,
                settings: &str,
            ) -> wasmtime::Result<Result<(), String>> {
                match self {
                    $(Exports::$variant(exports) => exports.call_init(store, settings).await,)*
                    Exports::None => Ok(Err("the instance has no exports".into())),
                }
            }
        }
    };
}

worlds! {
    Transform => transform::{Transform, TransformPre},
    Sink => sink::{Sink, SinkPre},
    Budget => budget::{Budget, BudgetPre},
    Router => router::{Router, RouterPre},
}
