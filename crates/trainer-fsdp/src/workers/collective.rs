//! [`CollectiveWorkers`]: the workers seam on burn 0.21's collective runtime
//! (`burn-collective`).
//!
//! One rank is one peer of the collective: a thread of the process that owns one device and a
//! replica of the policy. The peers of one machine meet in burn's local collective server (one
//! per backend type, in the process); machines meet through burn's global orchestrator
//! ([`NodeSetup`]). What this module adds on top, and why:
//!
//! - **Gradients are all-reduced in the model's structural order**, not in `ParamId` order:
//!   two replicas loaded separately hold different parameter ids, and burn's
//!   `GradientsParams::all_reduce` (which sorts by id) would pair one rank's gradient of a
//!   parameter with another rank's gradient of a different one whenever the shapes agree.
//!   Walking the module with a visitor pairs them by position, whatever their ids.
//! - **A parameter with a gradient on some ranks only** (a micro-batch that did not reach it)
//!   is reduced against zeros on the others, so that every rank issues the same collectives;
//!   one with a gradient on no rank stays without one (the optimizer does not touch it), as on
//!   one rank.
//! - **Gradients travel in buckets**: flattened and concatenated in visit order up to
//!   [`BUCKET`] elements, one all-reduce per bucket (a LoRA adapter's gradients in one), split
//!   back after.
//! - **Scalars are gathered exactly**: the runtime reduces float tensors by sum and mean only,
//!   so [`Workers::all_gather`] sums a tensor in which each rank wrote its block and left the
//!   others zero (`x + 0 = x` exactly), with every `f64` carried as four `f32`s holding
//!   16 of its bits each (integers below 2^24 are exact in `f32`). Min, max and sums ([`Workers::reduce_scalars`]) are taken from
//!   the gathered values in rank order, so every rank computes the same bits.
//! - **The mean is taken here** (a sum, then a division by the world size): the runtime's own
//!   mean divides by the peers of one machine.

use std::any::TypeId;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_collective::{CollectiveConfig, CollectiveError, PeerId, ReduceOperation};

use super::Workers;
use crate::error::TrainerError;

/// Where this process sits in a run of several machines: the orchestrator every node reaches,
/// this node's index and the addresses the nodes exchange tensors on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSetup {
    /// Machines (processes) in the run.
    pub nodes: usize,
    /// This machine's index, `0..nodes`; its ranks are `node_rank * local peers ..`.
    pub node_rank: usize,
    /// The global orchestrator's address (`ws://host:port`).
    pub orchestrator: String,
    /// This node's address as the other nodes reach it (`ws://host:port`, the data port's).
    pub node_address: String,
    /// The port this node serves tensors on to the other nodes.
    pub data_port: u16,
}

type SumFn = dyn Fn(Vec<f32>) -> Result<Vec<f32>, CollectiveError> + Send + Sync;
type FinishFn = dyn Fn() -> Result<(), CollectiveError> + Send + Sync;

/// One rank of a multi-rank run on burn's collective runtime. See the module docs.
///
/// Every rank must issue the same collectives in the same order: the run does (each phase
/// calls them at fixed points, whatever the rank's data); a rank that ends early leaves the
/// others waiting until [`CollectiveWorkers::abort`] releases them with an error.
pub struct CollectiveWorkers {
    rank: usize,
    world_size: usize,
    host_threads: usize,
    peer: PeerId,
    backend: TypeId,
    backend_name: &'static str,
    sum: Box<SumFn>,
    finish: Box<FinishFn>,
    reset: fn(),
    bucket: usize,
}

impl std::fmt::Debug for CollectiveWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectiveWorkers")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("host_threads", &self.host_threads)
            .field("backend", &self.backend_name)
            .finish()
    }
}

impl CollectiveWorkers {
    /// Registers local peer `local` of `local_peers` on this machine (one per device), on the
    /// plain backend `B` (the inner backend of the run's autodiff backend: the collective
    /// runtime does not run on `Autodiff<_>`), and blocks until every peer of the run — on
    /// every node of `node`, when there are several — registered.
    ///
    /// # Errors
    /// [`TrainerError::Collective`] for a bad setup (a local index out of range, node
    /// addresses that do not parse) and for a registration the runtime refused.
    pub fn register<B: Backend>(
        local: usize,
        local_peers: usize,
        device: B::Device,
        host_threads: usize,
        node: Option<&NodeSetup>,
    ) -> Result<Self, TrainerError> {
        let (nodes, node_rank) = node.map_or((1, 0), |n| (n.nodes, n.node_rank));
        let world_size = nodes * local_peers;
        let rank = node_rank * local_peers + local;
        let fail = |cause: String| TrainerError::Collective {
            rank,
            world_size,
            operation: "register".into(),
            cause,
        };
        if local_peers == 0 || local >= local_peers || nodes == 0 || node_rank >= nodes {
            return Err(fail(format!(
                "peer {local} of {local_peers} on node {node_rank} of {nodes}: expected \
                 local < local peers and node rank < nodes"
            )));
        }
        let mut config = CollectiveConfig::default().with_num_devices(local_peers);
        if let Some(n) = node {
            config =
                config
                    .with_num_nodes(n.nodes as u32)
                    .with_global_address(n.orchestrator.parse().map_err(|e| {
                        fail(format!("orchestrator address {:?}: {e}", n.orchestrator))
                    })?)
                    .with_node_address(
                        n.node_address
                            .parse()
                            .map_err(|e| fail(format!("node address {:?}: {e}", n.node_address)))?,
                    )
                    .with_data_service_port(n.data_port)
                    // the ring strategy refuses a tensor with fewer elements than machines (a
                    // bias, a scalar gather); the tree takes any shape
                    .with_global_all_reduce_strategy(burn_collective::AllReduceStrategy::Tree(2));
        }
        let peer = PeerId::from(rank);
        burn_collective::register::<B>(peer, device.clone(), config)
            .map_err(|e| fail(describe(&e)))?;
        let sum_device = device;
        Ok(Self {
            rank,
            world_size,
            host_threads: host_threads.max(1),
            peer,
            backend: TypeId::of::<B>(),
            backend_name: std::any::type_name::<B>(),
            sum: Box::new(move |values: Vec<f32>| {
                let n = values.len();
                let t = Tensor::<B, 1>::from_data(TensorData::new(values, [n]), &sum_device);
                let reduced = burn_collective::all_reduce::<B>(
                    peer,
                    t.into_primitive().tensor(),
                    ReduceOperation::Sum,
                )?;
                let t = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(reduced));
                Ok(t.into_data()
                    .convert::<f32>()
                    .to_vec::<f32>()
                    .unwrap_or_default())
            }),
            finish: Box::new(move || burn_collective::finish_collective::<B>(peer)),
            reset: burn_collective::reset_collective::<B>,
            bucket: BUCKET,
        })
    }

    /// At most `elements` gradient elements per all-reduce (default [`BUCKET`]; a tensor
    /// larger than that goes alone). Every rank must use the same.
    pub fn with_bucket_elements(mut self, elements: usize) -> Self {
        self.bucket = elements.max(1);
        self
    }

    /// Leaves the collective (every rank does, at the end of the run).
    ///
    /// # Errors
    /// [`TrainerError::Collective`] when the runtime refuses (a peer that was released by
    /// [`CollectiveWorkers::abort`] is no longer registered).
    pub fn finish(&self) -> Result<(), TrainerError> {
        (self.finish)().map_err(|e| self.error("finish", describe(&e)))
    }

    /// Releases every peer of this machine waiting in a collective, with an error, and forgets
    /// the registrations: what a launcher does when one of its ranks failed, so that the
    /// others end instead of waiting for it forever.
    pub fn abort(&self) {
        (self.reset)();
    }

    fn error(&self, operation: &str, cause: String) -> TrainerError {
        TrainerError::Collective {
            rank: self.rank,
            world_size: self.world_size,
            operation: operation.into(),
            cause,
        }
    }

    /// The element-wise sum over ranks of `values` (every rank passes as many).
    fn sum(&self, operation: &str, values: Vec<f32>) -> Result<Vec<f32>, TrainerError> {
        let n = values.len();
        let out = (self.sum)(values).map_err(|e| self.error(operation, describe(&e)))?;
        if out.len() != n {
            return Err(self.error(operation, format!("{} values came back for {n}", out.len())));
        }
        Ok(out)
    }
}

/// What a collective error means for the run, with the runtime's own name for it.
fn describe(e: &CollectiveError) -> String {
    match e {
        CollectiveError::LocalServerMissing | CollectiveError::RegisterNotFirstOperation => {
            format!(
                "the collective ended under this rank: another rank of this machine failed, or \
                 a machine of the run was lost ({e:?})"
            )
        }
        CollectiveError::Global(g) => {
            format!("between the machines: {g:?} (a lost machine ends the run on the others)")
        }
        other => format!("{other:?}"),
    }
}

/// `f32`s per gathered `f64`: its bits in four 16-bit pieces, each an integer an `f32` holds
/// exactly.
const PIECES: usize = 4;

fn split(x: f64) -> [f32; PIECES] {
    let bits = x.to_bits();
    std::array::from_fn(|i| ((bits >> (16 * i)) & 0xFFFF) as f32)
}

fn join(pieces: &[f32]) -> f64 {
    f64::from_bits(
        pieces
            .iter()
            .enumerate()
            .fold(0u64, |acc, (i, &p)| acc | ((p as u64) << (16 * i))),
    )
}

impl Workers for CollectiveWorkers {
    fn world_size(&self) -> usize {
        self.world_size
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn host_threads(&self) -> usize {
        self.host_threads
    }

    fn all_gather(&self, values: &[f64]) -> Result<Vec<Vec<f64>>, TrainerError> {
        let (w, r, n) = (self.world_size, self.rank, values.len());
        // the lengths first: a mismatch is an error, not a shape the runtime trips on
        let mut lengths = vec![0.0f32; w];
        lengths[r] = n as f32;
        let lengths = self.sum("all_gather lengths", lengths)?;
        if let Some(other) = lengths.iter().position(|&l| l as usize != n) {
            return Err(self.error(
                "all_gather",
                format!(
                    "rank {other} gathers {} values where rank {r} gathers {n}: every rank \
                     must issue the same collectives",
                    lengths[other]
                ),
            ));
        }
        if n == 0 {
            // nothing to gather (a barrier): the lengths were the collective
            return Ok(vec![Vec::new(); w]);
        }
        let mut block = vec![0.0f32; w * n * PIECES];
        for (i, &x) in values.iter().enumerate() {
            let at = (r * n + i) * PIECES;
            block[at..at + PIECES].copy_from_slice(&split(x));
        }
        let all = self.sum("all_gather", block)?;
        Ok((0..w)
            .map(|rank| {
                (0..n)
                    .map(|i| {
                        let at = (rank * n + i) * PIECES;
                        join(&all[at..at + PIECES])
                    })
                    .collect()
            })
            .collect())
    }

    fn all_reduce_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        mut grads: GradientsParams,
        model: &M,
    ) -> Result<GradientsParams, TrainerError> {
        if TypeId::of::<B::InnerBackend>() != self.backend {
            return Err(self.error(
                "all_reduce_grads",
                format!(
                    "the peer was registered on {} but the gradients live on {}",
                    self.backend_name,
                    std::any::type_name::<B::InnerBackend>()
                ),
            ));
        }
        // which parameters have a gradient on this rank, in structural order
        let mut present = Presence::<B> {
            grads: &grads,
            present: Vec::new(),
            _b: std::marker::PhantomData,
        };
        model.visit(&mut present);
        let mine = present.present;
        let anywhere = self
            .all_gather(&mine)
            .map_err(|e| self.error("all_reduce_grads presence", e.to_string()))?;
        let reduce: Vec<bool> = (0..mine.len())
            .map(|i| anywhere.iter().any(|rank| rank[i] != 0.0))
            .collect();
        // the gradients (zeros where this rank has none), flattened in visit order
        let mut gather = Flatten::<B> {
            grads: &mut grads,
            reduce,
            index: 0,
            flat: Vec::new(),
        };
        model.visit(&mut gather);
        let Flatten { flat, reduce, .. } = gather;
        // buckets of whole tensors, each all-reduced at once: one collective per bucket, not
        // per parameter
        let mut reduced: Vec<Tensor<B::InnerBackend, 1>> = Vec::with_capacity(flat.len());
        let mut i = 0;
        while i < flat.len() {
            let mut end = i;
            let mut elements = 0;
            while end < flat.len() && (end == i || elements + flat[end].dims()[0] <= self.bucket) {
                elements += flat[end].dims()[0];
                end += 1;
            }
            let sizes: Vec<usize> = flat[i..end].iter().map(|t| t.dims()[0]).collect();
            let bucket = Tensor::cat(flat[i..end].to_vec(), 0);
            let sum = burn_collective::all_reduce::<B::InnerBackend>(
                self.peer,
                bucket.into_primitive().tensor(),
                ReduceOperation::Sum,
            )
            .map_err(|e| {
                self.error(
                    "all_reduce_grads",
                    format!(
                        "the gradients of parameters {i}..{end} (in visit order): {}",
                        describe(&e)
                    ),
                )
            })?;
            let mean = Tensor::<B::InnerBackend, 1>::from_primitive(TensorPrimitive::Float(sum))
                .div_scalar(self.world_size as f64);
            let mut at = 0;
            for n in sizes {
                reduced.push(mean.clone().narrow(0, at, n));
                at += n;
            }
            i = end;
        }
        // back into the gradients, reshaped, in the same order
        let mut scatter = Scatter::<B, _> {
            grads: &mut grads,
            reduce,
            index: 0,
            reduced: reduced.into_iter(),
            _b: std::marker::PhantomData,
        };
        model.visit(&mut scatter);
        Ok(grads)
    }
}

/// Elements per all-reduce bucket by default (256 MiB of f32): small enough for a copy of the gradients
/// beside them, large enough that a LoRA adapter's gradients travel in one collective.
pub const BUCKET: usize = 1 << 26;

/// Records, per float parameter in visit order, whether it has a gradient (1) or not (0).
struct Presence<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    present: Vec<f64>,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Presence<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let has = self.grads.get::<B::InnerBackend, D>(param.id).is_some();
        self.present.push(if has { 1.0 } else { 0.0 });
    }
}

/// Takes, in visit order, the gradient of every float parameter that has one on some rank (a
/// zero gradient where this rank has none), flattened.
struct Flatten<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    reduce: Vec<bool>,
    index: usize,
    flat: Vec<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let i = self.index;
        self.index += 1;
        if !self.reduce.get(i).copied().unwrap_or(false) {
            return;
        }
        let grad = self
            .grads
            .remove::<B::InnerBackend, D>(param.id)
            .unwrap_or_else(|| param.val().inner().zeros_like());
        let n = grad.shape().num_elements();
        self.flat.push(grad.reshape([n]));
    }
}

/// Registers the reduced gradients back, in the order [`Flatten`] took them, in their
/// parameters' shapes.
struct Scatter<'a, B: AutodiffBackend, I: Iterator<Item = Tensor<B::InnerBackend, 1>>> {
    grads: &'a mut GradientsParams,
    reduce: Vec<bool>,
    index: usize,
    reduced: I,
    _b: std::marker::PhantomData<B>,
}

impl<B, I> ModuleVisitor<B> for Scatter<'_, B, I>
where
    B: AutodiffBackend,
    I: Iterator<Item = Tensor<B::InnerBackend, 1>>,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let i = self.index;
        self.index += 1;
        if !self.reduce.get(i).copied().unwrap_or(false) {
            return;
        }
        let shape = param.val().shape();
        if let Some(g) = self.reduced.next() {
            self.grads
                .register::<B::InnerBackend, D>(param.id, g.reshape(shape));
        }
    }
}
