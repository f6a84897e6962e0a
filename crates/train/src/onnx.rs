//! ONNX exports of a checkpoint, built from its framework-neutral export (`relevance.json`):
//! `relevance.onnx` (features → r(x), what serving ranks by) and, for the additive model,
//! `click_model.onnx` (features, position[, bias features] → σ(θ_k + b(z) + r(x))). Serving stacks
//! (Vespa, Triton, feature stores) load ONNX; the few protobuf messages an ONNX file needs are
//! encoded here rather than pulling in a protobuf toolchain.

use std::path::Path;

use super::export::{DenseLayer, RelevanceExport};

pub const RELEVANCE_ONNX: &str = "relevance.onnx";
pub const CLICK_ONNX: &str = "click_model.onnx";
/// ONNX IR version 8 (ONNX 1.10+) with the default-domain opset 17: every runtime of the last
/// years loads it.
const IR_VERSION: i64 = 8;
const OPSET: i64 = 17;

const FLOAT: i64 = 1;
const INT64: i64 = 7;

/// A protobuf message under construction (wire format: varint keys, length-delimited submessages).
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn key(&mut self, field: u32, wire: u8) {
        self.varint(((field as u64) << 3) | wire as u64);
    }
    fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.key(field, 0);
        self.varint(v as u64);
        self
    }
    fn float(&mut self, field: u32, v: f32) -> &mut Self {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    fn string(&mut self, field: u32, s: &str) -> &mut Self {
        self.bytes(field, s.as_bytes())
    }
    fn message(&mut self, field: u32, m: Message) -> &mut Self {
        self.bytes(field, &m.0)
    }
}

/// A tensor input or output: `name`, element type, dimensions (`None`: the batch, named "batch").
fn value_info(name: &str, elem_type: i64, dims: &[Option<i64>]) -> Message {
    let mut shape = Message::default();
    for d in dims {
        let mut dim = Message::default();
        match d {
            Some(v) => dim.int(1, *v),
            None => dim.string(2, "batch"),
        };
        shape.message(1, dim);
    }
    let mut tensor = Message::default();
    tensor.int(1, elem_type).message(2, shape);
    let mut ty = Message::default();
    ty.message(1, tensor);
    let mut info = Message::default();
    info.string(1, name).message(2, ty);
    info
}

/// A constant (an initializer): dims, then little-endian raw data.
fn tensor(name: &str, elem_type: i64, dims: &[i64], raw: Vec<u8>) -> Message {
    let mut t = Message::default();
    for d in dims {
        t.int(1, *d);
    }
    t.int(2, elem_type).string(8, name).bytes(9, &raw);
    t
}

fn float_tensor(name: &str, dims: &[i64], values: impl IntoIterator<Item = f32>) -> Message {
    tensor(name, FLOAT, dims, values.into_iter().flat_map(f32::to_le_bytes).collect())
}

fn int64_tensor(name: &str, dims: &[i64], values: &[i64]) -> Message {
    tensor(name, INT64, dims, values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// A graph being assembled: nodes and constants in order, fresh names for intermediates.
#[derive(Default)]
struct Graph {
    nodes: Vec<Message>,
    initializers: Vec<Message>,
    next: usize,
}

enum Attribute {
    Float(&'static str, f32),
    Int(&'static str, i64),
}

impl Graph {
    fn fresh(&mut self, stem: &str) -> String {
        self.next += 1;
        format!("{stem}_{}", self.next)
    }

    fn constant(&mut self, t: Message, name: String) -> String {
        self.initializers.push(t);
        name
    }

    fn floats(&mut self, stem: &str, dims: &[i64], values: impl IntoIterator<Item = f32>) -> String {
        let name = self.fresh(stem);
        let t = float_tensor(&name, dims, values);
        self.constant(t, name)
    }

    fn ints(&mut self, stem: &str, dims: &[i64], values: &[i64]) -> String {
        let name = self.fresh(stem);
        let t = int64_tensor(&name, dims, values);
        self.constant(t, name)
    }

    /// Adds `op(inputs) → output` (a fresh name unless given) and returns the output's name.
    fn node(&mut self, op: &str, inputs: &[&str], attributes: &[Attribute], output: Option<&str>) -> String {
        let out = output.map(str::to_string).unwrap_or_else(|| self.fresh(&op.to_lowercase()));
        let mut n = Message::default();
        for i in inputs {
            n.string(1, i);
        }
        n.string(2, &out).string(3, &format!("{op}_{}", self.nodes.len())).string(4, op);
        for a in attributes {
            let mut m = Message::default();
            match a {
                Attribute::Float(name, v) => m.string(1, name).float(2, *v).int(20, 1),
                Attribute::Int(name, v) => m.string(1, name).int(3, *v).int(20, 2),
            };
            n.message(5, m);
        }
        self.nodes.push(n);
        out
    }

    /// The dense layers of `relevance.json` on `input` ([batch, n] → [batch, 1]), ELU between layers.
    fn layers(&mut self, input: &str, layers: &[DenseLayer], elu_alpha: f64, output: Option<&str>) -> String {
        let mut h = input.to_string();
        for (l, layer) in layers.iter().enumerate() {
            let (rows, cols) = (layer.weight.len() as i64, layer.bias.len() as i64);
            let w = self.floats("weight", &[rows, cols], layer.weight.iter().flatten().copied());
            let b = self.floats("bias", &[cols], layer.bias.iter().copied());
            let product = self.node("MatMul", &[&h, &w], &[], None);
            let last = l + 1 == layers.len();
            h = self.node("Add", &[&product, &b], &[], if last { output } else { None });
            if !last {
                h = self.node("Elu", &[&h], &[Attribute::Float("alpha", elu_alpha as f32)], None);
            }
        }
        h
    }

    /// r(x) of `features` as `relevance.json` defines it: standardise, then the layers.
    fn relevance(&mut self, export: &RelevanceExport, output: Option<&str>) -> String {
        let mut h = "features".to_string();
        if let Some(n) = &export.standardization {
            let f = export.n_features as i64;
            let mean = self.floats("mean", &[f], n.mean[..export.n_features].iter().copied());
            let std = self.floats("std", &[f], n.std[..export.n_features].iter().copied());
            let centred = self.node("Sub", &[&h, &mean], &[], None);
            h = self.node("Div", &[&centred, &std], &[], None);
        }
        self.layers(&h, &export.layers, export.elu_alpha, output)
    }

    /// The ModelProto bytes.
    fn model(self, name: &str, inputs: Vec<Message>, outputs: Vec<Message>, metadata: &[(&str, String)]) -> Vec<u8> {
        let mut g = Message::default();
        for n in self.nodes {
            g.message(1, n);
        }
        g.string(2, name);
        for t in self.initializers {
            g.message(5, t);
        }
        for i in inputs {
            g.message(11, i);
        }
        for o in outputs {
            g.message(12, o);
        }
        let mut opset = Message::default();
        opset.string(1, "").int(2, OPSET);
        let mut m = Message::default();
        m.int(1, IR_VERSION).string(2, "ultr").string(3, env!("CARGO_PKG_VERSION")).message(7, g).message(8, opset);
        for (k, v) in metadata {
            let mut entry = Message::default();
            entry.string(1, k).string(2, v);
            m.message(14, entry);
        }
        m.0
    }
}

/// Why a checkpoint has no ONNX relevance tower, or `None` when it has one.
pub fn relevance_unsupported(export: &RelevanceExport) -> Option<String> {
    if export.tower.pair_embedding() {
        Some("an embedding tower is a lookup by (query_id, doc_id), not a function of features: serve it from relevance.json's `embedding` table".into())
    } else if export.layers.is_empty() {
        Some("the export has no layers".into())
    } else {
        None
    }
}

fn metadata(export: &RelevanceExport) -> Vec<(&'static str, String)> {
    let mut m = vec![("ultr.model", export.model.name().to_string()), ("ultr.n_features", export.n_features.to_string())];
    if let Some(k) = export.canonical_position {
        m.push(("ultr.canonical_position", k.to_string()));
    }
    if let Some(s) = &export.feature_schema {
        m.push(("ultr.feature_schema", s.label()));
        m.push(("ultr.features", s.features.iter().take(export.n_features).cloned().collect::<Vec<_>>().join(",")));
        if !s.bias_features.is_empty() {
            m.push(("ultr.bias_features", s.bias_features.join(",")));
        }
    }
    m
}

/// `relevance.onnx`: input `features` (float32 [batch, n_features], the stream's feature order),
/// output `relevance` (float32 [batch, 1]) = r(x), exactly `RelevanceExport::score_features`.
pub fn relevance_onnx(export: &RelevanceExport) -> anyhow::Result<Vec<u8>> {
    if let Some(why) = relevance_unsupported(export) {
        anyhow::bail!("no ONNX relevance tower: {why}");
    }
    let mut g = Graph::default();
    g.relevance(export, Some("relevance"));
    let f = export.n_features as i64;
    Ok(g.model(
        "ultr_relevance",
        vec![value_info("features", FLOAT, &[None, Some(f)])],
        vec![value_info("relevance", FLOAT, &[None, Some(1)])],
        &metadata(export),
    ))
}

/// `click_model.onnx` for the additive model with a feature tower: inputs `features` (float32
/// [batch, n_features]), `position` (int64 [batch], 1-based; positions past the trained K score
/// as K) and, with a bias tower, `bias_features` (float32 [batch, n_bias_features]); outputs
/// `click_logit` = θ_k + b(z) + r(x) and `click_probability` = σ(click_logit), both [batch, 1].
/// Other models' click logits are no plain function of (features, position) — they need the
/// session (XPA, DLA's listwise propensities), a mixture (MixEM) or posteriors (REM) — so only
/// their relevance tower is exported.
pub fn click_onnx(export: &RelevanceExport) -> anyhow::Result<Vec<u8>> {
    if let Some(why) = relevance_unsupported(export) {
        anyhow::bail!("no ONNX click model: {why}");
    }
    let click = export
        .click
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("no ONNX click model for model {:?}: its click logit is not the plain graph θ_k + b(z) + r(x)", export.model.name()))?;
    let mut g = Graph::default();
    let r = g.relevance(export, None);
    let k = click.theta.len() as i64;
    let theta = g.floats("theta", &[k, 1], click.theta.iter().map(|t| *t as f32));
    let (lowest, highest) = (g.ints("first_position", &[], &[1]), g.ints("last_position", &[], &[k]));
    let clipped = g.node("Clip", &["position", &lowest, &highest], &[], None);
    let index = g.node("Sub", &[&clipped, &lowest], &[], None);
    let theta_k = g.node("Gather", &[&theta, &index], &[Attribute::Int("axis", 0)], None);
    let mut logit = g.node("Add", &[&theta_k, &r], &[], None);
    let f = export.n_features as i64;
    let mut inputs = vec![value_info("features", FLOAT, &[None, Some(f)]), value_info("position", INT64, &[None])];
    if let Some(bias) = &click.bias_tower {
        let b = g.layers("bias_features", &bias.layers, export.elu_alpha, None);
        logit = g.node("Add", &[&logit, &b], &[], None);
        inputs.push(value_info("bias_features", FLOAT, &[None, Some(bias.n_bias_features as i64)]));
    }
    g.node("Identity", &[&logit], &[], Some("click_logit"));
    g.node("Sigmoid", &[&logit], &[], Some("click_probability"));
    Ok(g.model(
        "ultr_click_model",
        inputs,
        vec![value_info("click_logit", FLOAT, &[None, Some(1)]), value_info("click_probability", FLOAT, &[None, Some(1)])],
        &metadata(export),
    ))
}

/// Writes the ONNX files a checkpoint supports into `dir`; returns their names.
pub fn write_onnx(dir: &Path, export: &RelevanceExport) -> anyhow::Result<Vec<&'static str>> {
    let mut written = Vec::new();
    if relevance_unsupported(export).is_some() {
        return Ok(written);
    }
    std::fs::write(dir.join(RELEVANCE_ONNX), relevance_onnx(export)?)?;
    written.push(RELEVANCE_ONNX);
    if export.click.is_some() {
        std::fs::write(dir.join(CLICK_ONNX), click_onnx(export)?)?;
        written.push(CLICK_ONNX);
    }
    Ok(written)
}

#[cfg(feature = "unit-tests")]
#[cfg_attr(test, mutants::skip)]
pub mod tests {
    use super::*;

    pub fn varints_encode_as_protobuf_does() {
        let mut m = Message::default();
        m.int(1, 300);
        assert_eq!(m.0, vec![0x08, 0xac, 0x02]);
        let mut m = Message::default();
        m.int(2, -1);
        assert_eq!(m.0.len(), 1 + 10, "negative int64 is a ten-byte varint");
        let mut m = Message::default();
        m.string(2, "hi");
        assert_eq!(m.0, vec![0x12, 2, b'h', b'i']);
    }
}
