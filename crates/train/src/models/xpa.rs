//! XPA, cross-positional attention (Zhuang et al. 2021, "Cross-Positional Attention for Debiasing
//! Clicks", §4 Eq. 2–6): click = σ(r(x_j) + e_j), with the examination of the item at p_j
//! e_j = e_pos(p_j) + w_e·e_pos(p̃_j) + w_r·r(x̃_j) (Eq. 5). p_j is a learned position embedding,
//! e_pos an ELU layer over it, and x̃_j, p̃_j the other items' features and position embeddings of
//! the same session averaged by the attention a_jk = softmax_k(λ·p_jᵀp_k) over k ≠ j (Eq. 3), λ, w_e
//! and w_r trained. The ablations of §5.6: `position` keeps only the attended positions (w_r = 0),
//! `item` only the attended items (w_e = 0). Serving ranks by r(x).
//!
//! Its logits need the whole session, so it trains on sessions (lists; the click BCE is linear in the
//! clicks, so a list may carry click rates) and takes no IPS weights: the attention models how the
//! other shown items change examination, which a per-item reweighting would break. Scored on (q,d,k)
//! rows without their session (the residual monitor), each row is a session of one: e = e_pos(p).

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::inputs::{BatchTensors, Dimensions, TowerKind};
use super::interface::Model;
use super::tower::{elu, normal_init, Mlp, RelevanceTower};

/// Which cross terms the examination has (Zhuang §5.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum XpaVariant {
    /// e_pos(p) + w_e·e_pos(p̃) + w_r·r(x̃).
    #[default]
    Full,
    /// "XPA Pos": e_pos(p) + w_e·e_pos(p̃).
    Position,
    /// "XPA Item": e_pos(p) + w_r·r(x̃).
    Item,
}

impl XpaVariant {
    /// Whether e_pos of the attended positions, w_e·e_pos(p̃), enters the examination.
    fn attends_positions(self) -> bool {
        matches!(self, XpaVariant::Full | XpaVariant::Position)
    }

    /// Whether the attended items' relevance, w_r·r(x̃), enters the examination.
    fn attends_items(self) -> bool {
        matches!(self, XpaVariant::Full | XpaVariant::Item)
    }
}

/// `[train.xpa]` (model = "xpa").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct XpaConfig {
    pub variant: XpaVariant,
    /// Width of the position embedding p.
    pub position_embedding: usize,
    /// Width of e_pos's ELU layer.
    pub hidden_units: usize,
}

impl Default for XpaConfig {
    fn default() -> Self {
        XpaConfig { variant: XpaVariant::Full, position_embedding: 8, hidden_units: 16 }
    }
}

impl XpaConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (key, v) in [("position_embedding", self.position_embedding), ("hidden_units", self.hidden_units)] {
            if v == 0 {
                return Err(format!("key `train.xpa.{key}` must be >= 1"));
            }
        }
        Ok(())
    }
}

/// A masked entry's attention score: exp underflows to 0.
const MASKED: f32 = -1.0e4;

#[derive(Module, Debug)]
pub struct Xpa {
    pub relevance: RelevanceTower,
    /// p_k, [K, D].
    pub position: Param<Tensor<2>>,
    /// λ, [1].
    pub scale: Param<Tensor<1>>,
    /// e_pos: D → hidden (ELU) → 1.
    pub examination_hidden: Linear,
    pub examination_output: Linear,
    /// w_e, w_r.
    pub cross_weights: Param<Tensor<1>>,
    /// Which cross-positional terms enter (from the architecture; not a parameter).
    #[module(skip)]
    pub variant: XpaVariant,
}

impl Model for Xpa {
    const NAME: &'static str = "xpa";
    const SUMMARY: &'static str = "Zhuang 2021 §4: examination from cross-positional attention over the session's items.";
    const LISTWISE: bool = true;
    const SESSION_LOGITS: bool = true;
    type Shape = XpaConfig;
    type Settings = ();

    fn new(dims: &Dimensions, shape: &XpaConfig, device: &Device) -> Self {
        let (k, d) = (dims.max_positions, shape.position_embedding);
        Xpa {
            relevance: RelevanceTower::new(dims, device),
            position: Param::from_tensor(Tensor::from_data(TensorData::new(normal_init(k * d, 0.3, 0x2021_0003), [k, d]), device)),
            scale: Param::from_tensor(Tensor::ones([1], device)),
            examination_hidden: LinearConfig::new(d, shape.hidden_units).init(device),
            examination_output: LinearConfig::new(shape.hidden_units, 1).init(device),
            cross_weights: Param::from_tensor(Tensor::zeros([2], device)),
            variant: shape.variant,
        }
    }

    /// The logits of a batch: with lists, every item's session enters; without, each row is alone.
    fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
        let r = self.relevance.forward(b);
        let p = self.position.val().select(0, b.positions.clone());
        let own = self.examination_of(p.clone());
        let Some(lists) = &b.lists else { return r + own };
        let (count, width) = (lists.count, lists.width);
        let d = p.dims()[1];
        let a = self.attention(p.reshape([count, width, d]), lists.mask.clone());
        let w = self.cross_weights.val();
        let mut e = own;
        if self.variant.attends_positions() {
            let attended = a.clone().matmul(self.position.val().select(0, b.positions.clone()).reshape([count, width, d])).reshape([count * width, d]);
            e = e + self.examination_of(attended) * w.clone().slice([0..1]).expand([count * width]);
        }
        if self.variant.attends_items() {
            let attended_items = self.attended_relevance(b, a, count, width);
            e = e + attended_items * w.slice([1..2]).expand([count * width]);
        }
        r + e
    }

    /// e_pos(p_k) − e_pos(p_1): the examination of a position alone.
    fn position_bias(&self, _max_positions: usize) -> Vec<f64> {
        let e: Vec<f32> = self.examination_of(self.position.val()).into_data().try_to_vec::<f32>().expect("f32");
        e.iter().map(|v| (*v - e[0]) as f64).collect()
    }

    fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
        self.relevance.forward(b)
    }

    fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
        (self.relevance.embedding.clone(), self.relevance.mlp.clone())
    }

    fn grow_embedding(mut self, vocabulary: usize, device: &Device) -> Self {
        self.relevance = self.relevance.grow(vocabulary, device);
        self
    }

    fn validate(_tower: TowerKind, _max_positions: usize, shape: &XpaConfig) -> Result<(), String> {
        shape.validate()
    }
}

impl Xpa {
    /// e_pos of position embeddings [n, D] → [n].
    fn examination_of(&self, p: Tensor<2>) -> Tensor<1> {
        self.examination_output.forward(elu(self.examination_hidden.forward(p))).squeeze_dim::<1>(1)
    }

    /// The attention matrices of the batch's lists, [lists, width, width]: a_jk over the other real
    /// items k ≠ j of each list (rows of padding and of one-item lists are 0).
    fn attention(&self, p: Tensor<3>, mask: Tensor<2>) -> Tensor<3> {
        let [count, width, _] = p.dims();
        let device = p.device();
        let keys = mask.clone().reshape([count, 1, width]).repeat_dim(1, width);
        let eye: Tensor<2> = Tensor::from_data(TensorData::new((0..width * width).map(|i| if i / width == i % width { 1f32 } else { 0.0 }).collect::<Vec<_>>(), [width, width]), &device);
        let allowed = keys * eye.neg().add_scalar(1.0).reshape([1, width, width]).repeat_dim(0, count);
        let lambda = self.scale.val().reshape([1, 1, 1]).repeat_dim(0, count).repeat_dim(1, width).repeat_dim(2, width);
        let scores = p.clone().matmul(p.swap_dims(1, 2)) * lambda + allowed.clone().sub_scalar(1.0).mul_scalar(-MASKED);
        softmax(scores, 2) * allowed
    }

    /// r(x̃_j) with x̃_j = Σ_k a_jk x_k (features), or Σ_k a_jk γ_k for the embedding tower.
    fn attended_relevance(&self, b: &BatchTensors, a: Tensor<3>, count: usize, width: usize) -> Tensor<1> {
        match &b.features {
            Some(x) if self.relevance.mlp.is_some() => {
                let f = x.dims()[1];
                let attended = a.matmul(x.clone().reshape([count, width, f])).reshape([count * width, f]);
                self.relevance.mlp.as_ref().expect("a feature tower").forward(attended)
            }
            _ => a.matmul(self.relevance.forward(b).reshape([count, width, 1])).reshape([count * width]),
        }
    }

    /// The attention matrix of a session showing positions 1..=n, row j = a_j· (Zhuang Fig. 5).
    pub fn attention_matrix(&self, n: usize) -> Vec<Vec<f64>> {
        let device = self.position.val().device();
        let d = self.position.val().dims()[1];
        let positions = Tensor::<1, Int>::from_data(TensorData::new((0..n as i64).collect::<Vec<_>>(), [n]), &device);
        let p = self.position.val().select(0, positions).reshape([1, n, d]);
        let a: Vec<f32> = self.attention(p, Tensor::ones([1, n], &device)).into_data().try_to_vec::<f32>().expect("f32");
        (0..n).map(|j| (0..n).map(|k| a[j * n + k] as f64).collect()).collect()
    }

    /// λ, w_e, w_r.
    pub fn scalars(&self) -> (f64, f64, f64) {
        let l = self.scale.val().into_data().try_to_vec::<f32>().expect("f32")[0] as f64;
        let w: Vec<f32> = self.cross_weights.val().into_data().try_to_vec::<f32>().expect("f32");
        (l, w[0] as f64, w[1] as f64)
    }
}
