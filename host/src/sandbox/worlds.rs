//! How the sandbox links, instantiates and `init`s each world of
//! [`crate::world::WORLDS`]: one line per world and served version whose
//! exports differ in the `worlds!` call below (its variant, world and the
//! `bindgen!` module of `bindings.rs`). Calling a world's own
//! exports (`transform`, `admit`, …) is `PluginInstance`'s.

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::bindings;
use crate::world::World;

macro_rules! worlds {
    ($($variant:ident = $world:ident => $($module:ident)::+ { $exports:ident, $pre:ident }),* $(,)?) => {
        /// A component linked for its world, ready to instantiate in a
        /// store holding `T` (the instance's `PluginState`).
        pub(super) enum PluginPre<T: 'static> {
            $($variant($($module)::+::$pre<T>),)*
        }

        /// A live instance's exports, typed by its world.
        pub(super) enum Exports {
            /// Before instantiation finished.
            None,
            $($variant($($module)::+::$exports),)*
        }

        impl<T: Send + 'static> PluginPre<T> {
            /// Checks the linked component against `world`'s exports, at
            /// each version served, today's first (the error said is today's).
            pub(super) fn new(
                world: World,
                pre: InstancePre<T>,
            ) -> wasmtime::Result<PluginPre<T>> {
                let mut first_error = None;
                $(
                    if world == World::$world {
                        match $($module)::+::$pre::new(pre.clone()) {
                            Ok(typed) => return Ok(PluginPre::$variant(typed)),
                            Err(err) => {
                                first_error.get_or_insert(err);
                            }
                        }
                    }
                )*
                Err(first_error.unwrap_or_else(|| wasmtime::format_err!("no bindings for world {world:?}")))
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
    Transform = Transform => bindings::transform { Transform, TransformPre },
    TransformV0_2 = Transform => bindings::v0_2_0::transform { Transform, TransformPre },
    Sink = Sink => bindings::sink { Sink, SinkPre },
    SinkV0_2 = Sink => bindings::v0_2_0::sink { Sink, SinkPre },
    // The policy worlds did not change in 0.3.0: one binding serves both.
    Budget = Budget => bindings::budget { Budget, BudgetPre },
    Router = Router => bindings::router { Router, RouterPre },
}
