//! `QwenImageTransformer2DModel`: the Qwen-Image MMDiT (diffusers 0.35.2
//! `models/transformers/transformer_qwenimage.py`), module by module.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, Tensor, TensorData};

use model_weights::in_dtype;

use crate::attention::joint_attention;
use crate::config::{NORM_EPS, QwenImageConfig};
use crate::layers::{Adapters, Linear, LinearConfig, RmsNorm, RmsNormConfig, gelu_tanh, silu};
use crate::rope::{ImageShape, apply_rope, rope_tables};

/// Channels of the sinusoidal timestep embedding (diffusers `Timesteps(num_channels=256)`).
pub const TIMESTEP_CHANNELS: usize = 256;
/// Scale applied to the timestep before the sinusoids (diffusers `Timesteps(scale=1000)`).
pub const TIMESTEP_SCALE: f32 = 1000.0;

/// The one remap table between this crate's module paths and diffusers checkpoint keys.
///
/// Every other module path is the diffusers key itself (`img_in`, `txt_norm`,
/// `time_text_embed.timestep_embedder.linear_1`, `transformer_blocks.{i}.attn.to_q`,
/// `transformer_blocks.{i}.attn.norm_added_k`, `norm_out.linear`, `proj_out`, ...). The rows
/// below exist because diffusers wraps these layers in `nn.Sequential` / `nn.ModuleList`
/// whose integer indices cannot be Rust field names. Paths are relative to a transformer
/// block; a parameter key is the module path plus `.weight` / `.bias`.
///
/// | burn module path      | diffusers module path  | why                                   |
/// |-----------------------|------------------------|---------------------------------------|
/// | `img_mod`             | `img_mod.1`            | `nn.Sequential(nn.SiLU(), nn.Linear)` |
/// | `txt_mod`             | `txt_mod.1`            | same                                  |
/// | `attn.to_out`         | `attn.to_out.0`        | `ModuleList([Linear, Dropout])`       |
/// | `img_mlp.net_0.proj`  | `img_mlp.net.0.proj`   | `FeedForward.net[0]` is `GELU.proj`   |
/// | `img_mlp.net_2`       | `img_mlp.net.2`        | `FeedForward.net[2]`                  |
/// | `txt_mlp.net_0.proj`  | `txt_mlp.net.0.proj`   | same                                  |
/// | `txt_mlp.net_2`       | `txt_mlp.net.2`        | same                                  |
///
/// burn's `Linear` weight is `[d_in, d_out]`, PyTorch's `[d_out, d_in]`: every `.weight` of a
/// linear layer is transposed on load and export (norm weights and biases are not).
pub const CHECKPOINT_REMAP: &[(&str, &str)] = &[
    ("img_mod", "img_mod.1"),
    ("txt_mod", "txt_mod.1"),
    ("attn.to_out", "attn.to_out.0"),
    ("img_mlp.net_0.proj", "img_mlp.net.0.proj"),
    ("img_mlp.net_2", "img_mlp.net.2"),
    ("txt_mlp.net_0.proj", "txt_mlp.net.0.proj"),
    ("txt_mlp.net_2", "txt_mlp.net.2"),
];

/// The diffusers module path of a burn module path (see [`CHECKPOINT_REMAP`]).
///
/// ```
/// use dit_models::model::checkpoint_name;
///
/// assert_eq!(checkpoint_name("transformer_blocks.3.attn.to_out"), "transformer_blocks.3.attn.to_out.0");
/// assert_eq!(checkpoint_name("transformer_blocks.0.img_mlp.net_0.proj"), "transformer_blocks.0.img_mlp.net.0.proj");
/// assert_eq!(checkpoint_name("transformer_blocks.0.attn.to_q"), "transformer_blocks.0.attn.to_q");
/// assert_eq!(checkpoint_name("proj_out"), "proj_out");
/// ```
pub fn checkpoint_name(burn_path: &str) -> String {
    if let Some(rest) = burn_path.strip_prefix("transformer_blocks.")
        && let Some((index, inner)) = rest.split_once('.')
    {
        for (ours, theirs) in CHECKPOINT_REMAP {
            if inner == *ours {
                return format!("transformer_blocks.{index}.{theirs}");
            }
        }
    }
    burn_path.to_string()
}

/// diffusers `TimestepEmbedding`: `linear_2(silu(linear_1(x)))`.
#[derive(Module, Debug)]
pub struct TimestepEmbedding<B: Backend> {
    /// `256 -> inner_dim`.
    pub linear_1: Linear<B>,
    /// `inner_dim -> inner_dim`.
    pub linear_2: Linear<B>,
}

/// diffusers `QwenTimestepProjEmbeddings`: sinusoids of `1000 t`, then [`TimestepEmbedding`].
#[derive(Module, Debug)]
pub struct QwenTimestepProjEmbeddings<B: Backend> {
    /// The MLP on the sinusoids.
    pub timestep_embedder: TimestepEmbedding<B>,
}

/// The projection inside diffusers' `GELU` activation module (`FeedForward.net[0]`).
#[derive(Module, Debug)]
pub struct GeluProj<B: Backend> {
    /// `dim -> 4 dim`, followed by GELU-tanh.
    pub proj: Linear<B>,
}

/// diffusers `FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate")`:
/// `net_2(gelu_tanh(net_0.proj(x)))`, hidden width `4 dim`.
#[derive(Module, Debug)]
pub struct FeedForward<B: Backend> {
    /// diffusers `net.0` (remapped, see [`CHECKPOINT_REMAP`]).
    pub net_0: GeluProj<B>,
    /// diffusers `net.2`.
    pub net_2: Linear<B>,
}

/// The joint attention of a block (diffusers `Attention` with
/// `QwenDoubleStreamAttnProcessor2_0`): image projections `to_q/to_k/to_v/to_out.0`, text
/// projections `add_q_proj/add_k_proj/add_v_proj/to_add_out`, per-head RMSNorm on queries and
/// keys of both streams.
#[derive(Module, Debug)]
pub struct JointAttention<B: Backend> {
    /// Image queries.
    pub to_q: Linear<B>,
    /// Image keys.
    pub to_k: Linear<B>,
    /// Image values.
    pub to_v: Linear<B>,
    /// Image output projection (diffusers `to_out.0`).
    pub to_out: Linear<B>,
    /// Text queries.
    pub add_q_proj: Linear<B>,
    /// Text keys.
    pub add_k_proj: Linear<B>,
    /// Text values.
    pub add_v_proj: Linear<B>,
    /// Text output projection.
    pub to_add_out: Linear<B>,
    /// Image query norm, `[head_dim]`.
    pub norm_q: RmsNorm<B>,
    /// Image key norm.
    pub norm_k: RmsNorm<B>,
    /// Text query norm.
    pub norm_added_q: RmsNorm<B>,
    /// Text key norm.
    pub norm_added_k: RmsNorm<B>,
    /// Number of heads.
    pub heads: usize,
}

/// One dual-stream block (diffusers `QwenImageTransformerBlock`).
#[derive(Module, Debug)]
pub struct QwenImageTransformerBlock<B: Backend> {
    /// Image AdaLN modulation, `dim -> 6 dim` (diffusers `img_mod.1`).
    pub img_mod: Linear<B>,
    /// Joint attention.
    pub attn: JointAttention<B>,
    /// Image MLP.
    pub img_mlp: FeedForward<B>,
    /// Text AdaLN modulation (diffusers `txt_mod.1`).
    pub txt_mod: Linear<B>,
    /// Text MLP.
    pub txt_mlp: FeedForward<B>,
}

/// diffusers `AdaLayerNormContinuous(dim, dim, elementwise_affine=False, eps=1e-6)`.
#[derive(Module, Debug)]
pub struct AdaLayerNormContinuous<B: Backend> {
    /// `dim -> 2 dim`: scale, then shift.
    pub linear: Linear<B>,
}

/// The Qwen-Image transformer (diffusers `QwenImageTransformer2DModel`).
///
/// Build one with [`QwenImageConfig::init`] (random, lazily initialised) or load a diffusers
/// checkpoint with [`QwenImageTransformer2DModel::from_pretrained`]. Run it with
/// [`QwenImageTransformer2DModel::forward`]; samplers and trainers should take it through the
/// [`VelocityModel`](crate::VelocityModel) trait.
#[derive(Module, Debug)]
pub struct QwenImageTransformer2DModel<B: Backend> {
    /// Timestep embedding.
    pub time_text_embed: QwenTimestepProjEmbeddings<B>,
    /// RMSNorm on the text-encoder states, `[joint_attention_dim]`.
    pub txt_norm: RmsNorm<B>,
    /// `in_channels -> inner_dim`.
    pub img_in: Linear<B>,
    /// `joint_attention_dim -> inner_dim`.
    pub txt_in: Linear<B>,
    /// The dual-stream blocks.
    pub transformer_blocks: Vec<QwenImageTransformerBlock<B>>,
    /// Final AdaLN.
    pub norm_out: AdaLayerNormContinuous<B>,
    /// `inner_dim -> patch_size^2 * out_channels`.
    pub proj_out: Linear<B>,
    /// The configuration.
    #[module(skip)]
    pub config: QwenImageConfig,
    /// sha256 of the base weights (see [`crate::weights::hash_tensors`]), when known.
    #[module(skip)]
    pub base_model_hash: Option<String>,
    /// The LoRA configuration of the attached adapter, if any.
    #[module(skip)]
    pub lora_config: Option<crate::lora::LoraConfig>,
}

/// The inputs of one forward pass (diffusers `forward` arguments).
#[derive(Clone, Debug)]
pub struct QwenImageInput<B: Backend> {
    /// Packed image latents, `[batch, image_tokens, in_channels]`.
    pub hidden_states: Tensor<B, 3>,
    /// Text-encoder states, `[batch, text_tokens, joint_attention_dim]`.
    pub encoder_hidden_states: Tensor<B, 3>,
    /// `[batch, text_tokens]`, `true` for a real token, `false` for padding; padded keys are
    /// excluded from the joint attention. `None` attends to every token — exactly what
    /// diffusers 0.35.2 does whatever mask it is given (its attention processor ignores
    /// `encoder_hidden_states_mask`).
    pub encoder_hidden_states_mask: Option<Tensor<B, 2, Bool>>,
    /// `[batch]`, the diffusers model input: the pipeline passes `timestep / 1000`, i.e. the
    /// flow-matching sigma in `[0, 1]`.
    pub timestep: Tensor<B, 1>,
    /// The token grids of the images in `hidden_states`, in order; shared by the batch (as in
    /// diffusers, which reads only `img_shapes[0]`). Their token counts sum to `image_tokens`.
    pub img_shapes: Vec<ImageShape>,
}

impl<B: Backend> QwenImageInput<B> {
    /// The input with its float tensors in `dtype` (the mask and the grids as they are).
    pub(crate) fn in_dtype(self, dtype: DType) -> Self {
        Self {
            hidden_states: in_dtype(self.hidden_states, dtype),
            encoder_hidden_states: in_dtype(self.encoder_hidden_states, dtype),
            timestep: in_dtype(self.timestep, dtype),
            ..self
        }
    }
}

impl QwenImageConfig {
    /// A model with random, lazily initialised weights (materialised on first use; loading a
    /// checkpoint into it never allocates the random values).
    ///
    /// Panics if the configuration is invalid; call [`QwenImageConfig::validate`] first for a
    /// typed error.
    pub fn init<B: Backend>(&self, device: &B::Device) -> QwenImageTransformer2DModel<B> {
        if let Err(e) = self.validate() {
            panic!("{e}");
        }
        let dim = self.inner_dim();
        let lin = |i: usize, o: usize| LinearConfig::new(i, o).init::<B>(device);
        let norm = |d: usize| RmsNormConfig::new(d).with_eps(NORM_EPS).init::<B>(device);
        let ff = || FeedForward {
            net_0: GeluProj {
                proj: lin(dim, 4 * dim),
            },
            net_2: lin(4 * dim, dim),
        };
        let head = self.attention_head_dim;
        let blocks = (0..self.num_layers)
            .map(|_| QwenImageTransformerBlock {
                img_mod: lin(dim, 6 * dim),
                attn: JointAttention {
                    to_q: lin(dim, dim),
                    to_k: lin(dim, dim),
                    to_v: lin(dim, dim),
                    to_out: lin(dim, dim),
                    add_q_proj: lin(dim, dim),
                    add_k_proj: lin(dim, dim),
                    add_v_proj: lin(dim, dim),
                    to_add_out: lin(dim, dim),
                    norm_q: norm(head),
                    norm_k: norm(head),
                    norm_added_q: norm(head),
                    norm_added_k: norm(head),
                    heads: self.num_attention_heads,
                },
                img_mlp: ff(),
                txt_mod: lin(dim, 6 * dim),
                txt_mlp: ff(),
            })
            .collect();
        QwenImageTransformer2DModel {
            time_text_embed: QwenTimestepProjEmbeddings {
                timestep_embedder: TimestepEmbedding {
                    linear_1: lin(TIMESTEP_CHANNELS, dim),
                    linear_2: lin(dim, dim),
                },
            },
            txt_norm: norm(self.joint_attention_dim),
            img_in: lin(self.in_channels, dim),
            txt_in: lin(self.joint_attention_dim, dim),
            transformer_blocks: blocks,
            norm_out: AdaLayerNormContinuous {
                linear: lin(dim, 2 * dim),
            },
            proj_out: lin(dim, self.out_token_channels()),
            config: self.clone(),
            base_model_hash: None,
            lora_config: None,
        }
    }
}

/// A parameterised layer of the model, by kind.
pub(crate) enum LayerMut<'a, B: Backend> {
    Linear(&'a mut Linear<B>),
    Norm(&'a mut RmsNorm<B>),
}

/// A parameterised layer of the model, by kind (shared borrow).
pub(crate) enum LayerRef<'a, B: Backend> {
    Linear(&'a Linear<B>),
    Norm(&'a RmsNorm<B>),
}

macro_rules! layers_impl {
    ($self:ident, $kind:ident, $iter:ident, [$($mutability:tt)*]) => {{
        let mut out: Vec<(String, $kind<'_, B>)> = Vec::new();
        let t = & $($mutability)* $self.time_text_embed.timestep_embedder;
        out.push(("time_text_embed.timestep_embedder.linear_1".into(), $kind::Linear(& $($mutability)* t.linear_1)));
        out.push(("time_text_embed.timestep_embedder.linear_2".into(), $kind::Linear(& $($mutability)* t.linear_2)));
        out.push(("txt_norm".into(), $kind::Norm(& $($mutability)* $self.txt_norm)));
        out.push(("img_in".into(), $kind::Linear(& $($mutability)* $self.img_in)));
        out.push(("txt_in".into(), $kind::Linear(& $($mutability)* $self.txt_in)));
        for (i, b) in $self.transformer_blocks.$iter().enumerate() {
            let p = |s: &str| format!("transformer_blocks.{i}.{s}");
            let a = & $($mutability)* b.attn;
            out.push((p("img_mod"), $kind::Linear(& $($mutability)* b.img_mod)));
            out.push((p("attn.to_q"), $kind::Linear(& $($mutability)* a.to_q)));
            out.push((p("attn.to_k"), $kind::Linear(& $($mutability)* a.to_k)));
            out.push((p("attn.to_v"), $kind::Linear(& $($mutability)* a.to_v)));
            out.push((p("attn.to_out"), $kind::Linear(& $($mutability)* a.to_out)));
            out.push((p("attn.add_q_proj"), $kind::Linear(& $($mutability)* a.add_q_proj)));
            out.push((p("attn.add_k_proj"), $kind::Linear(& $($mutability)* a.add_k_proj)));
            out.push((p("attn.add_v_proj"), $kind::Linear(& $($mutability)* a.add_v_proj)));
            out.push((p("attn.to_add_out"), $kind::Linear(& $($mutability)* a.to_add_out)));
            out.push((p("attn.norm_q"), $kind::Norm(& $($mutability)* a.norm_q)));
            out.push((p("attn.norm_k"), $kind::Norm(& $($mutability)* a.norm_k)));
            out.push((p("attn.norm_added_q"), $kind::Norm(& $($mutability)* a.norm_added_q)));
            out.push((p("attn.norm_added_k"), $kind::Norm(& $($mutability)* a.norm_added_k)));
            out.push((p("img_mlp.net_0.proj"), $kind::Linear(& $($mutability)* b.img_mlp.net_0.proj)));
            out.push((p("img_mlp.net_2"), $kind::Linear(& $($mutability)* b.img_mlp.net_2)));
            out.push((p("txt_mod"), $kind::Linear(& $($mutability)* b.txt_mod)));
            out.push((p("txt_mlp.net_0.proj"), $kind::Linear(& $($mutability)* b.txt_mlp.net_0.proj)));
            out.push((p("txt_mlp.net_2"), $kind::Linear(& $($mutability)* b.txt_mlp.net_2)));
        }
        out.push(("norm_out.linear".into(), $kind::Linear(& $($mutability)* $self.norm_out.linear)));
        out.push(("proj_out".into(), $kind::Linear(& $($mutability)* $self.proj_out)));
        out
    }};
}

impl<B: Backend> QwenImageTransformer2DModel<B> {
    /// The configuration the model was built with.
    pub fn config(&self) -> &QwenImageConfig {
        &self.config
    }

    /// The model with `n` more transformer blocks after its own, each with its image and text
    /// AdaLN modulations at zero (DiT's adaLN-Zero): every gate of a new block is closed, so
    /// the grown model computes exactly what this one did, and training opens the gates
    /// (their gradients are not zero). The new blocks' other weights are PyTorch's
    /// initialisation, materialised here. The configuration's `num_layers` grows by `n`; the
    /// base-model hash is dropped (the weights are another model's).
    ///
    /// # Errors
    /// [`crate::DitError::InvalidLora`] when an adapter is attached (grow the base, then attach).
    pub fn grow(mut self, n: usize, device: &B::Device) -> Result<Self, crate::DitError> {
        if self.lora_config.is_some() {
            return Err(crate::DitError::InvalidLora {
                problems: vec![crate::error::ConfigProblem {
                    field: "grow",
                    given: format!("{n} blocks on a model carrying an adapter"),
                    allowed: "a model without an adapter (grow the base, then attach one)".into(),
                }],
            });
        }
        let fresh = self
            .config
            .clone()
            .with_num_layers(n.max(1))
            .init::<B>(device);
        let dim = self.config.inner_dim();
        let closed = || {
            let mut l = LinearConfig::new(dim, 6 * dim).init::<B>(device);
            l.weight = burn::module::Param::from_tensor(Tensor::zeros([dim, 6 * dim], device));
            l.bias = Some(burn::module::Param::from_tensor(Tensor::zeros(
                [6 * dim],
                device,
            )));
            l
        };
        for mut block in fresh.transformer_blocks.into_iter().take(n) {
            block.img_mod = closed();
            block.txt_mod = closed();
            block.visit(&mut Materialise);
            self.transformer_blocks.push(block);
        }
        self.config.num_layers += n;
        self.base_model_hash = None;
        Ok(self)
    }

    /// Every parameterised layer with its burn module path.
    pub(crate) fn layers_mut(&mut self) -> Vec<(String, LayerMut<'_, B>)> {
        layers_impl!(self, LayerMut, iter_mut, [mut])
    }

    /// Every parameterised layer with its burn module path (shared borrow).
    pub(crate) fn layers(&self) -> Vec<(String, LayerRef<'_, B>)> {
        layers_impl!(self, LayerRef, iter, [])
    }

    /// The diffusers module names of every `Linear` layer, in model order — what LoRA target
    /// suffixes are matched against.
    pub fn linear_names(&self) -> Vec<String> {
        self.layers()
            .into_iter()
            .filter(|(_, l)| matches!(l, LayerRef::Linear(_)))
            .map(|(n, _)| checkpoint_name(&n))
            .collect()
    }

    /// The velocity prediction `[batch, image_tokens, patch_size^2 * out_channels]`, with the
    /// LoRA adapters (if any) enabled.
    pub fn forward(&self, input: QwenImageInput<B>) -> Tensor<B, 3> {
        self.forward_with(input, Adapters::Enabled)
    }

    /// The float dtype the model computes in: that of its base weights. Inputs of another
    /// dtype are cast to it on the way in and the output back to the input's dtype, so bf16
    /// weights on a GPU serve an f32 sampler and trainer unchanged. LoRA adapters keep their
    /// own dtype (f32 as attached or loaded), whatever the base's.
    pub fn compute_dtype(&self) -> DType {
        self.img_in.weight.val().dtype()
    }

    /// [`Self::forward`] with the adapters switched on or off for this call.
    ///
    /// Panics with a precise message when shapes disagree (token count vs `img_shapes`,
    /// channels vs the configuration, batch sizes, mask shape).
    pub fn forward_with(&self, input: QwenImageInput<B>, adapters: Adapters) -> Tensor<B, 3> {
        let s_txt = self.check_input(&input);
        let out_dtype = input.hidden_states.dtype();
        let input = input.in_dtype(self.compute_dtype());
        let QwenImageInput {
            hidden_states,
            encoder_hidden_states,
            encoder_hidden_states_mask,
            timestep,
            img_shapes,
        } = input;
        let ctx = self.block_context(
            &img_shapes,
            s_txt,
            encoder_hidden_states_mask,
            (&hidden_states.device(), hidden_states.dtype()),
            adapters,
        );
        let (img, txt, temb) =
            self.prologue(hidden_states, encoder_hidden_states, timestep, adapters);
        let ctx = ctx.with_temb(&temb);
        let (mut img, mut txt) = (img, txt);
        for block in &self.transformer_blocks {
            (img, txt) = block.forward(img, txt, &ctx);
        }
        in_dtype(self.epilogue(img, temb, adapters), out_dtype)
    }

    /// Panics with a precise message on inconsistent input shapes; returns the text length.
    pub(crate) fn check_input(&self, input: &QwenImageInput<B>) -> usize {
        let cfg = self.config();
        let [b, s_img, c_in] = input.hidden_states.dims();
        let [bt, s_txt, c_txt] = input.encoder_hidden_states.dims();
        let grid_tokens: usize = input.img_shapes.iter().map(ImageShape::tokens).sum();
        assert_eq!(
            s_img, grid_tokens,
            "hidden_states has {s_img} image tokens but img_shapes {:?} make {grid_tokens}",
            input.img_shapes
        );
        assert_eq!(
            c_in, cfg.in_channels,
            "hidden_states has {c_in} channels; the config has in_channels = {}",
            cfg.in_channels
        );
        assert_eq!(
            c_txt, cfg.joint_attention_dim,
            "encoder_hidden_states has {c_txt} channels; the config has joint_attention_dim = {}",
            cfg.joint_attention_dim
        );
        assert_eq!(
            bt, b,
            "encoder_hidden_states batch {bt} != hidden_states batch {b}"
        );
        let bts = input.timestep.dims()[0];
        assert_eq!(bts, b, "timestep has {bts} entries for a batch of {b}");
        if let Some(m) = &input.encoder_hidden_states_mask {
            assert_eq!(
                m.dims(),
                [b, s_txt],
                "encoder_hidden_states_mask must be [batch, text_tokens] = [{b}, {s_txt}]"
            );
        }
        s_txt
    }

    /// Input projections and the timestep embedding: `(img, txt, temb)`.
    pub(crate) fn prologue(
        &self,
        hidden_states: Tensor<B, 3>,
        encoder_hidden_states: Tensor<B, 3>,
        timestep: Tensor<B, 1>,
        adapters: Adapters,
    ) -> (Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 2>) {
        let dtype = hidden_states.dtype();
        let img = self.img_in.forward(hidden_states, adapters);
        let txt = self
            .txt_in
            .forward(self.txt_norm.forward(encoder_hidden_states), adapters);
        (img, txt, self.time_embedding(timestep, dtype, adapters))
    }

    /// RoPE tables and the joint key mask (the per-forward constants of every block).
    pub(crate) fn block_context(
        &self,
        img_shapes: &[ImageShape],
        s_txt: usize,
        encoder_hidden_states_mask: Option<Tensor<B, 2, Bool>>,
        (device, dtype): (&B::Device, DType),
        adapters: Adapters,
    ) -> BlockContext<B> {
        let s_img: usize = img_shapes.iter().map(ImageShape::tokens).sum();
        let tables = rope_tables(self.config().axes_dims_rope, img_shapes, s_txt);
        let (cos, sin) = tables.to_tensors::<B>(device, dtype);
        let key_mask = encoder_hidden_states_mask.map(|m| {
            let b = m.dims()[0];
            Tensor::cat(
                vec![m, Tensor::<B, 2, Bool>::full([b, s_img], true, device)],
                1,
            )
        });
        BlockContext {
            silu_temb: None,
            cos,
            sin,
            key_mask,
            adapters,
        }
    }

    /// `norm_out` and `proj_out` on the image stream.
    pub(crate) fn epilogue(
        &self,
        img: Tensor<B, 3>,
        temb: Tensor<B, 2>,
        adapters: Adapters,
    ) -> Tensor<B, 3> {
        let emb = self
            .norm_out
            .linear
            .forward(silu(temb), adapters)
            .unsqueeze_dim::<3>(1);
        let [scale, shift] = chunks::<B, 2>(emb);
        let img = modulate(img, shift, scale);
        self.proj_out.forward(img, adapters)
    }

    /// `[batch]` timesteps to `[batch, inner_dim]` (diffusers `QwenTimestepProjEmbeddings`):
    /// `[cos(1000 t f_k), sin(1000 t f_k)]` with `f_k = exp(-ln(10000) k / 128)`, computed in
    /// `f32` and cast to `dtype` (that of the activations), then the MLP.
    fn time_embedding(
        &self,
        timestep: Tensor<B, 1>,
        dtype: DType,
        adapters: Adapters,
    ) -> Tensor<B, 2> {
        let half = TIMESTEP_CHANNELS / 2;
        // f32 as torch computes it: exponent in f32, exp rounded once.
        let ln = -(10000f64.ln() as f32);
        let freqs: Vec<f32> = (0..half)
            .map(|k| (((ln * k as f32) / half as f32) as f64).exp() as f32)
            .collect();
        let device = timestep.device();
        let freqs =
            Tensor::<B, 2>::from_data(TensorData::new(freqs, [1, half]), (&device, DType::F32));
        let t = timestep.cast(DType::F32).unsqueeze_dim::<2>(1);
        let args = (t * freqs).mul_scalar(TIMESTEP_SCALE);
        let sinusoids = Tensor::cat(vec![args.clone().cos(), args.sin()], 1).cast(dtype);
        let e = &self.time_text_embed.timestep_embedder;
        e.linear_2
            .forward(silu(e.linear_1.forward(sinusoids, adapters)), adapters)
    }
}

/// Per-forward values shared by every block.
#[derive(Clone)]
pub(crate) struct BlockContext<B: Backend> {
    pub(crate) silu_temb: Option<Tensor<B, 2>>,
    /// The RoPE tables of the joint sequence, `[seq, head_dim]`.
    pub(crate) cos: Tensor<B, 2>,
    pub(crate) sin: Tensor<B, 2>,
    pub(crate) key_mask: Option<Tensor<B, 2, Bool>>,
    pub(crate) adapters: Adapters,
}

impl<B: Backend> BlockContext<B> {
    /// The context with `silu(temb)` set.
    pub(crate) fn with_temb(mut self, temb: &Tensor<B, 2>) -> Self {
        self.silu_temb = Some(silu(temb.clone()));
        self
    }
}

/// Splits `[batch, 1, n * dim]` into `n` pieces `[batch, 1, dim]`.
fn chunks<B: Backend, const N: usize>(x: Tensor<B, 3>) -> [Tensor<B, 3>; N] {
    let parts = x.chunk(N, 2);
    parts
        .try_into()
        .unwrap_or_else(|_| panic!("modulation does not split into {N} chunks"))
}

/// `layer_norm(x) * (1 + scale) + shift` for `x: [batch, tokens, dim]` and the per-row
/// modulation `[batch, 1, dim]` ([`fused_ops::layer_norm_modulated`]: one pass on the CPU
/// backend, forward and backward).
fn modulate<B: Backend>(x: Tensor<B, 3>, shift: Tensor<B, 3>, scale: Tensor<B, 3>) -> Tensor<B, 3> {
    fused_ops::layer_norm_modulated(x, shift, scale, NORM_EPS)
}

impl<B: Backend> FeedForward<B> {
    /// `net_2(gelu_tanh(net_0.proj(x)))`.
    pub fn forward(&self, x: Tensor<B, 3>, adapters: Adapters) -> Tensor<B, 3> {
        self.net_2
            .forward(gelu_tanh(self.net_0.proj.forward(x, adapters)), adapters)
    }
}

impl<B: Backend> JointAttention<B> {
    /// Joint attention over `[text, image]`; returns `(image_out, text_out)`.
    ///
    /// `cos`/`sin` are the RoPE tables of the joint sequence (text first), `[seq, head_dim]`;
    /// `key_mask` is the joint key mask.
    pub fn forward(
        &self,
        img: Tensor<B, 3>,
        txt: Tensor<B, 3>,
        cos: &Tensor<B, 2>,
        sin: &Tensor<B, 2>,
        key_mask: Option<Tensor<B, 2, Bool>>,
        adapters: Adapters,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let [b, s_img, dim] = img.dims();
        let s_txt = txt.dims()[1];
        let h = self.heads;
        let heads = |x: Tensor<B, 3>, s: usize| x.reshape([b, s, h, dim / h]);
        let img_q = self
            .norm_q
            .forward(heads(self.to_q.forward(img.clone(), adapters), s_img));
        let img_k = self
            .norm_k
            .forward(heads(self.to_k.forward(img.clone(), adapters), s_img));
        let img_v = heads(self.to_v.forward(img, adapters), s_img);
        let txt_q = self
            .norm_added_q
            .forward(heads(self.add_q_proj.forward(txt.clone(), adapters), s_txt));
        let txt_k = self
            .norm_added_k
            .forward(heads(self.add_k_proj.forward(txt.clone(), adapters), s_txt));
        let txt_v = heads(self.add_v_proj.forward(txt, adapters), s_txt);

        let q = apply_rope(Tensor::cat(vec![txt_q, img_q], 1), cos, sin);
        let k = apply_rope(Tensor::cat(vec![txt_k, img_k], 1), cos, sin);
        let v = Tensor::cat(vec![txt_v, img_v], 1);
        let joint = joint_attention(q, k, v, key_mask);

        let txt_out = joint.clone().narrow(1, 0, s_txt);
        let img_out = joint.narrow(1, s_txt, s_img);
        (
            self.to_out.forward(img_out, adapters),
            self.to_add_out.forward(txt_out, adapters),
        )
    }
}

impl<B: Backend> QwenImageTransformerBlock<B> {
    pub(crate) fn forward(
        &self,
        img: Tensor<B, 3>,
        txt: Tensor<B, 3>,
        ctx: &BlockContext<B>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let a = ctx.adapters;
        let silu_temb = ctx.silu_temb.clone().expect("block context without temb");
        let img_mod = self
            .img_mod
            .forward(silu_temb.clone(), a)
            .unsqueeze_dim::<3>(1);
        let txt_mod = self.txt_mod.forward(silu_temb, a).unsqueeze_dim::<3>(1);
        let [i_shift1, i_scale1, i_gate1, i_shift2, i_scale2, i_gate2] = chunks::<B, 6>(img_mod);
        let [t_shift1, t_scale1, t_gate1, t_shift2, t_scale2, t_gate2] = chunks::<B, 6>(txt_mod);

        let (img_attn, txt_attn) = self.attn.forward(
            modulate(img.clone(), i_shift1, i_scale1),
            modulate(txt.clone(), t_shift1, t_scale1),
            &ctx.cos,
            &ctx.sin,
            ctx.key_mask.clone(),
            a,
        );
        // `x + r * gate` ([`fused_ops::gated_residual`]: one pass on the CPU backend).
        let img = fused_ops::gated_residual(img, img_attn, i_gate1);
        let txt = fused_ops::gated_residual(txt, txt_attn, t_gate1);

        let img_mlp = self
            .img_mlp
            .forward(modulate(img.clone(), i_shift2, i_scale2), a);
        let img = fused_ops::gated_residual(img, img_mlp, i_gate2);
        let txt_mlp = self
            .txt_mlp
            .forward(modulate(txt.clone(), t_shift2, t_scale2), a);
        let txt = fused_ops::gated_residual(txt, txt_mlp, t_gate2);
        (img, txt)
    }
}

/// Reads every float parameter, initialising a lazily initialised one in place (a clone of
/// a parameter not yet read would initialise on its own, to other values).
struct Materialise;

impl<B: Backend> burn::module::ModuleVisitor<B> for Materialise {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
        let _ = param.val();
    }
}
