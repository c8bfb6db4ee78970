//! A unit worker's pipeline runners, one per pipeline variant of the
//! generation it runs, built here and nowhere else (a lane of isolation is
//! made from its runner, `PipelineRunner::lane`). What the worker asks of
//! them all at once is asked here: whether any keeps state, what a batch
//! leaves on its way (its recorded calls, its state writes), the ack floor.

use crate::delivery::pipeline::PipelineRunner;
use crate::delivery::shadow::Shadows;
use crate::delivery::traced::CallRecord;
use crate::destination::Publisher;
use crate::reload::generation::Generation;
use crate::state::landing::Landing;
use crate::state::store::UnitState;

/// Every variant's runner (`None`: a variant whose plugins are not loaded).
pub(super) struct Runners {
    by_variant: Vec<Option<PipelineRunner>>,
}

impl Runners {
    /// A fresh runner (its own instances) for every pipeline variant of
    /// `generation` (one per pipeline without canaries). `unit` is the unit
    /// consumer's name: a destination's ledger names it; `publisher` is
    /// where a sink granted `nats` publishes; a runner with a shadowed
    /// transform feeds its queue in `shadows`.
    pub fn build(
        generation: &Generation,
        state: Option<&UnitState>,
        unit: &str,
        publisher: &Publisher,
        shadows: &Shadows,
    ) -> Runners {
        let by_variant = (0..generation.variant_count())
            .map(|variant| {
                let pipeline = generation
                    .config()
                    .pipelines
                    .get(generation.variant_pipeline(variant)?)?;
                let plugin = |name: &str| generation.plugin_in(variant, name).cloned();
                let mut runner = PipelineRunner::new(pipeline, plugin, state.cloned())?
                    .with_destination(unit, true)
                    .with_publisher(publisher);
                // A batch's state writes travel while the next batch runs.
                runner.overlap_state_writes();
                Some(match shadows.tap(generation, variant) {
                    Some(tap) => runner.observed(tap),
                    None => runner,
                })
            })
            .collect::<Vec<Option<PipelineRunner>>>();
        let mut by_variant = by_variant;
        let mut first = Vec::new();
        for runner in by_variant.iter_mut().flatten() {
            runner.share_objects(&mut first);
        }
        Runners { by_variant }
    }

    pub fn get_mut(&mut self, variant: usize) -> Option<&mut PipelineRunner> {
        self.by_variant.get_mut(variant)?.as_mut()
    }

    fn each(&self) -> impl Iterator<Item = &PipelineRunner> {
        self.by_variant.iter().flatten()
    }

    fn each_mut(&mut self) -> impl Iterator<Item = &mut PipelineRunner> {
        self.by_variant.iter_mut().flatten()
    }

    /// Whether any runner keeps state (its rows' acks are recorded).
    pub fn is_stateful(&self) -> bool {
        self.each().any(PipelineRunner::is_stateful)
    }

    /// Whether any runner remembers the rows it applied (state or a
    /// destination), so the worker prunes what the server confirmed.
    pub fn remembers_applied(&self) -> bool {
        self.each().any(PipelineRunner::remembers_applied)
    }

    /// Before a batch runs: each runner records its calls if `traced`.
    pub fn begin_batch(&mut self, traced: bool) {
        if traced {
            self.each_mut().for_each(PipelineRunner::record_calls);
        }
    }

    /// After a batch ran: the calls it recorded, and its state writes on
    /// their way (its rows are answered once they landed).
    pub fn end_batch(&mut self) -> (Vec<CallRecord>, Landing) {
        let mut landing = Landing::default();
        let mut calls = Vec::new();
        for runner in self.each_mut() {
            calls.extend(runner.take_calls());
            landing.join(runner.take_landing());
        }
        (calls, landing)
    }

    /// Whether any runner's sink fills objects.
    pub fn fill_objects(&self) -> bool {
        self.each().any(PipelineRunner::fills_objects)
    }

    /// Seals every object the sinks are filling, to be committed now.
    pub fn flush_objects(&self) {
        self.each().for_each(PipelineRunner::flush_objects);
    }

    pub fn set_ack_floor(&mut self, floor: u64) {
        self.each_mut()
            .for_each(|runner| runner.set_ack_floor(floor));
    }

    pub fn forget_applied(&mut self, sequences: &[u64]) {
        self.each_mut()
            .for_each(|runner| runner.forget_applied(sequences));
    }
}
