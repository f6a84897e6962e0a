//! The one place that picks the burn backend: a CPU backend by default, a GPU one behind a feature.

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

/// Which burn backend trains and scores (`[train] backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// `burn-flex`, burn-ndarray's successor: the default (measured faster here, see README).
    #[default]
    Flex,
    /// `burn-ndarray`, deprecated since burn 0.22; kept to compare (build with
    /// `--features ndarray-backend`).
    Ndarray,
    /// CUDA (build with `--features cuda`).
    Cuda,
}

impl BackendKind {
    /// The inference device (no autodiff).
    pub fn device(self) -> anyhow::Result<Device> {
        match self {
            BackendKind::Flex => Ok(Device::flex()),
            #[cfg(feature = "ndarray-backend")]
            #[allow(deprecated, reason = "the deprecated ndarray backend, measured against flex on purpose")]
            BackendKind::Ndarray => Ok(Device::ndarray()),
            #[cfg(not(feature = "ndarray-backend"))]
            BackendKind::Ndarray => anyhow::bail!("backend `ndarray` needs a build with `--features ndarray-backend`"),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => Ok(Device::cuda(0)),
            #[cfg(not(feature = "cuda"))]
            BackendKind::Cuda => anyhow::bail!("backend `cuda` needs a build with `--features cuda`"),
        }
    }

    /// The training device: the same backend with automatic differentiation.
    pub fn autodiff_device(self) -> anyhow::Result<Device> {
        Ok(self.device()?.autodiff())
    }
}
