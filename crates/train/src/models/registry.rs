//! The macros that turn the model registry (one line per model in `mod.rs`) into `ModelKind`,
//! `AnyModel` and their dispatch to the `Model` trait.

/// An option's value: the given expression, or the type's default when the registry line has none.
macro_rules! or_default {
    () => {
        Default::default()
    };
    ($e:expr) => {
        $e
    };
}

/// Declares each model's file and generates `ModelKind`, `AnyModel`, their dispatch, and the config
/// sections models own (`ModelSections`, and `ShapeSections` of `Architecture`) from one line per
/// model: `Variant => file::Type [shape <section>[: Type]] [settings <section>: Type]`. A section
/// with its type is the model's own, declared by that line (`Type` in the model's file); a shape
/// without one is a section several models share, declared once under `shared_shapes`.
macro_rules! registry {
    (
        shared_shapes { $( $shared:ident : $shared_file:ident :: $shared_ty:ident ),* $(,)? }
        models { $( $kind:ident => $file:ident :: $ty:ident $([shape $shape:ident $(: $shape_ty:ident)?])? $([settings $settings:ident : $settings_ty:ident])? ),* $(,)? }
    ) => {
        $( pub mod $file; )*

        /// The config sections models own, each a `[train.<section>]` table of its model's file:
        /// shapes (part of the architecture) and objective settings (a warm start may change them).
        /// Flattened into `[train]`; every section is checked, whichever model is chosen.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
        #[serde(default)]
        pub struct ModelSections {
            $( pub $shared: $shared_file::$shared_ty, )*
            $( $( $( pub $shape: $file::$shape_ty, )? )? $( pub $settings: $file::$settings_ty, )? )*
        }

        impl ModelSections {
            /// Checks every model's settings section (`Model::validate_settings`); errors name the key.
            pub fn validate(&self) -> Result<(), String> {
                $( $( <$file::$ty as Model>::validate_settings(&self.$settings)?; )? )*
                Ok(())
            }
        }

        /// The shape sections a checkpoint's architecture records: the chosen model's, the others unset.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct ShapeSections {
            $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $shared: Option<$shared_file::$shared_ty>, )*
            $( $( $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $shape: Option<$file::$shape_ty>, )? )? )*
        }

        /// `[train] model`: which click model is trained.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ModelKind {
            $( $kind, )*
        }

        impl ModelKind {
            pub const ALL: &'static [ModelKind] = &[$( ModelKind::$kind, )*];

            pub fn name(self) -> &'static str {
                match self { $( ModelKind::$kind => <$file::$ty as Model>::NAME, )* }
            }

            fn aliases(self) -> &'static [&'static str] {
                match self { $( ModelKind::$kind => <$file::$ty as Model>::ALIASES, )* }
            }

            pub fn summary(self) -> &'static str {
                match self { $( ModelKind::$kind => <$file::$ty as Model>::SUMMARY, )* }
            }

            /// How it reads its training examples: whole sessions as lists (no IPS weights) or
            /// independent rows.
            pub fn input_shape(self) -> InputShape {
                let lists = match self { $( ModelKind::$kind => <$file::$ty as Model>::LISTWISE, )* };
                if lists { InputShape::Lists } else { InputShape::Rows }
            }

            /// The layout a batch it scores needs: lists where its click logits need the session,
            /// or where `fit_loss` asks for its own listwise training loss; rows otherwise.
            pub fn scoring_shape(self, fit_loss: bool) -> InputShape {
                if self.session_logits() || (fit_loss && self.input_shape().lists()) { InputShape::Lists } else { InputShape::Rows }
            }

            /// Its click logits are click probabilities (the gate's baseline comparison applies).
            pub fn calibrated_clicks(self) -> bool {
                match self { $( ModelKind::$kind => <$file::$ty as Model>::CALIBRATED_CLICKS, )* }
            }

            /// Its click logits need the item's session: losses are scored on lists.
            pub fn session_logits(self) -> bool {
                match self { $( ModelKind::$kind => <$file::$ty as Model>::SESSION_LOGITS, )* }
            }

            /// Its logit mixes position and relevance embeddings: a feature tower only, and served
            /// at a canonical position.
            pub fn embedding_interaction(self) -> bool {
                match self { $( ModelKind::$kind => <$file::$ty as Model>::EMBEDDING_INTERACTION, )* }
            }

            /// The name metrics and reports give this model with `tower` (see `Model::label`).
            pub fn label(self, tower: TowerKind) -> String {
                match self { $( ModelKind::$kind => <$file::$ty as Model>::label(tower), )* }
            }

            fn position_parameters(self) -> bool {
                match self { $( ModelKind::$kind => <$file::$ty as Model>::POSITION_PARAMETERS, )* }
            }

            /// The setting that makes training with these sections need relevance labels (see
            /// `Model::needs_labels`).
            pub fn needs_labels(self, sections: &ModelSections) -> Option<String> {
                let _ = sections;
                match self { $( ModelKind::$kind => <$file::$ty as Model>::needs_labels(&or_default!($( sections.$settings.clone() )?)), )* }
            }

            /// Checks the model's shape section against the shared dimensions.
            pub fn validate(self, tower: TowerKind, max_positions: usize, sections: &ModelSections) -> Result<(), String> {
                let _ = sections;
                match self { $( ModelKind::$kind => <$file::$ty as Model>::validate(tower, max_positions, &or_default!($( sections.$shape.clone() )?)), )* }
            }

            /// Sets the architecture's shape section of this model from `sections` (the others stay unset).
            pub fn set_shape(self, arch: &mut Architecture, sections: &ModelSections) {
                let _ = (&arch, sections);
                match self { $( ModelKind::$kind => { $( arch.shapes.$shape = Some(sections.$shape.clone()); )? } )* }
            }
        }

        /// The model, one variant per registered model.
        #[derive(Module, Debug)]
        pub enum AnyModel {
            $( $kind($file::$ty), )*
        }

        impl AnyModel {
            /// A fresh model of `arch.model`.
            pub fn new(arch: &Architecture, n_features: usize, n_bias_features: usize, vocabulary: usize, device: &Device) -> Self {
                let dims = arch.dimensions(n_features, n_bias_features, vocabulary);
                match arch.model {
                    $( ModelKind::$kind => {
                        let shape: <$file::$ty as Model>::Shape = or_default!($( arch.shapes.$shape.clone().unwrap_or_default() )?);
                        AnyModel::$kind(<$file::$ty as Model>::new(&dims, &shape, device))
                    } )*
                }
            }

            pub fn kind(&self) -> ModelKind {
                match self { $( AnyModel::$kind(_) => ModelKind::$kind, )* }
            }

            /// The relevance score r(x) of every row: what serving ranks by.
            pub fn relevance(&self, b: &BatchTensors) -> Tensor<1> {
                match self { $( AnyModel::$kind(m) => m.relevance(b), )* }
            }

            /// σ⁻¹ P(click) of every row, as the model predicts at inference (no dropout).
            pub fn click_logits(&self, b: &BatchTensors) -> Tensor<1> {
                match self { $( AnyModel::$kind(m) => m.click_logits(b), )* }
            }

            /// Σ w·BCE of the click logits over the batch's rows: the loss every model is compared on
            /// (the promotion gate, `ultr eval`), and pointwise models' early stopping.
            pub fn click_loss_sum(&self, b: &BatchTensors) -> Tensor<1> {
                match self { $( AnyModel::$kind(m) => m.click_loss_sum(b), )* }
            }

            /// The loss early stopping watches.
            pub fn fit_loss_sum(&self, b: &BatchTensors) -> Tensor<1> {
                match self { $( AnyModel::$kind(m) => m.fit_loss_sum(b), )* }
            }

            /// The training objective of one batch ÷ `denominator` (N, Σw, or the rows/lists drawn).
            pub fn objective(&self, b: &BatchTensors, denominator: f64, sections: &ModelSections) -> Tensor<1> {
                let _ = sections;
                let sum = match self { $( AnyModel::$kind(m) => m.objective_sum(b, &or_default!($( sections.$settings.clone() )?)), )* };
                sum.div_scalar(denominator)
            }

            /// The position bias the model estimates, relative to position 1, for k = 1..=K.
            pub fn position_bias(&self, max_positions: usize) -> Vec<f64> {
                match self { $( AnyModel::$kind(m) => m.position_bias(max_positions), )* }
            }

            /// The serving relevance as parameters (for the export): γ per pair, or one scalar MLP.
            pub fn relevance_parts(&self) -> (Option<Param<Tensor<1>>>, Option<Mlp>) {
                match self { $( AnyModel::$kind(m) => m.relevance_parts(), )* }
            }

            /// The position a serving system must assume for `relevance`, 1-based.
            pub fn canonical_position(&self) -> Option<usize> {
                match self { $( AnyModel::$kind(m) => m.canonical_position(), )* }
            }

            /// θ_k and b(z) where the click logit is the plain graph θ_k + b(z) + r(x) (see
            /// `Model::click_graph`).
            pub fn click_graph(&self) -> Option<(Tensor<1>, Option<Mlp>)> {
                match self { $( AnyModel::$kind(m) => m.click_graph(), )* }
            }

            /// Grows the embedding to `vocabulary` entries (new pairs start at 0) for a warm start.
            pub fn grow_embedding(self, vocabulary: usize, device: &Device) -> Self {
                match self { $( AnyModel::$kind(m) => AnyModel::$kind(m.grow_embedding(vocabulary, device)), )* }
            }

            /// Whether the logit has a per-position θ_k to refit (see `Model::has_position_logits`).
            pub fn has_position_logits(&self) -> bool {
                match self { $( AnyModel::$kind(m) => m.has_position_logits(), )* }
            }

            /// Adds `delta[k−1]` to every click logit at position k (see `Model::shift_position_logits`).
            pub fn shift_position_logits(&mut self, delta: &[f32]) -> bool {
                match self { $( AnyModel::$kind(m) => m.shift_position_logits(delta), )* }
            }

            /// Holds θ_k fixed in training (see `Model::freeze_position_logits`).
            pub fn freeze_position_logits(&mut self) -> bool {
                match self { $( AnyModel::$kind(m) => m.freeze_position_logits(), )* }
            }

            /// γ per vocabulary entry where the logit is θ_k + γ (see `Model::pair_relevance`).
            pub fn pair_relevance(&self) -> Option<Vec<f32>> {
                match self { $( AnyModel::$kind(m) => m.pair_relevance(), )* }
            }

            /// Replaces γ (see `Model::set_pair_relevance`).
            pub fn set_pair_relevance(&mut self, gamma: &[f32]) -> bool {
                match self { $( AnyModel::$kind(m) => m.set_pair_relevance(gamma), )* }
            }

            /// Writes the model's record.
            pub fn save(&self, path: &Path) -> anyhow::Result<()> {
                let saved = match self { $( AnyModel::$kind(m) => m.write_record(path), )* };
                saved.map_err(|e| anyhow::anyhow!("writing the model record {}: {e}", path.display()))
            }

            /// Loads a record written by `save` into a skeleton of `arch`.
            pub fn load(arch: &Architecture, n_features: usize, n_bias_features: usize, vocabulary: usize, path: &Path, device: &Device) -> anyhow::Result<Self> {
                let wrong = |e: String| anyhow::anyhow!("{}: cannot load the model record ({e}); was it written for another architecture?", path.display());
                Ok(match AnyModel::new(arch, n_features, n_bias_features, vocabulary, device) {
                    $( AnyModel::$kind(m) => AnyModel::$kind(m.read_record(path).map_err(wrong)?), )*
                })
            }
        }
    };
}
