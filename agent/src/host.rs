// SPDX-License-Identifier: Apache-2.0
//! Facts about the node, read once at start: kernel, CPU, and the GPUs the
//! NVIDIA driver lists. The GPU model and count are what a GPU-hour price is
//! chosen by (`ingero serve --gpu-price model:H100=…`), so they come from the
//! driver's own `/proc/driver/nvidia` files (present in every procfs mount of
//! a GPU node, no NVML, no device opened) rather than from a label a person
//! has to keep right.

use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HostFacts {
    pub kernel: Option<String>,
    pub cpu_model: Option<String>,
    pub cpu_cores: Option<u32>,
    pub gpu_model: Option<String>,
    pub gpu_count: Option<u32>,
    pub driver_version: Option<String>,
}

impl HostFacts {
    pub(crate) fn read() -> HostFacts {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string());
        let cpu_cores = std::thread::available_parallelism().ok().map(|n| n.get() as u32);
        let gpus = Gpus::read(Path::new("/proc/driver/nvidia"));
        HostFacts {
            kernel,
            cpu_model,
            cpu_cores,
            gpu_model: gpus.model,
            gpu_count: gpus.count,
            driver_version: gpus.driver,
        }
    }
}

/// What the NVIDIA driver says of the node's GPUs.
#[derive(Debug, Default, PartialEq)]
struct Gpus {
    model: Option<String>,
    count: Option<u32>,
    driver: Option<String>,
}

impl Gpus {
    /// `root` is `/proc/driver/nvidia`: `gpus/<bus id>/information` per GPU
    /// (`Model:  NVIDIA H100 80GB HBM3`), `version` for the driver. A node
    /// without the driver has neither: all `None`. Mixed models (rare) are
    /// named by the most common one.
    fn read(root: &Path) -> Gpus {
        let mut models: Vec<String> = Vec::new();
        let Ok(dir) = std::fs::read_dir(root.join("gpus")) else { return Gpus::default() };
        for e in dir.flatten() {
            let info = std::fs::read_to_string(e.path().join("information")).unwrap_or_default();
            let model = info.lines().find_map(|l| l.strip_prefix("Model:")).map(|m| m.trim().to_string());
            models.push(model.unwrap_or_default());
        }
        if models.is_empty() {
            return Gpus::default();
        }
        models.sort();
        let mut best: (usize, &str) = (0, "");
        for m in models.chunk_by(|a, b| a == b) {
            if m.len() > best.0 && !m[0].is_empty() {
                best = (m.len(), &m[0]);
            }
        }
        let version = std::fs::read_to_string(root.join("version")).unwrap_or_default();
        Gpus {
            model: (!best.1.is_empty()).then(|| best.1.to_string()),
            count: Some(models.len() as u32),
            driver: driver_version(&version),
        }
    }
}

/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar …`
/// (or `… Open Kernel Module for x86_64  570.86.15  Release Build …`): the
/// first dotted number on the NVRM line.
fn driver_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| w.contains('.') && w.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver's files as an 8-GPU H100 node has them (format copied from
    /// a real node's /proc/driver/nvidia).
    #[test]
    fn model_count_and_driver_come_from_the_driver_files() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..8 {
            let gpu = dir.path().join(format!("gpus/0000:{:02x}:00.0", 0x18 + i));
            std::fs::create_dir_all(&gpu).unwrap();
            let info = format!(
                "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t GPU-{i}\nBus Type: \t PCIe\nDevice Minor: \t {i}\nGPU Excluded:\t No\n"
            );
            std::fs::write(gpu.join("information"), info).unwrap();
        }
        std::fs::write(
            dir.path().join("version"),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16)  Thu Jan 16 2025\nGCC version:  gcc version 12.2.0\n",
        )
        .unwrap();
        let g = Gpus::read(dir.path());
        assert_eq!(
            g,
            Gpus { model: Some("NVIDIA H100 80GB HBM3".into()), count: Some(8), driver: Some("570.86.15".into()) }
        );
    }

    #[test]
    fn a_node_without_the_driver_has_no_gpu_facts() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Gpus::read(&dir.path().join("absent")), Gpus::default());
        assert_eq!(
            driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"),
            Some("550.54.15".into())
        );
        assert_eq!(driver_version("GCC version: 12.2"), None);
    }
}
