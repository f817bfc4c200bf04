//! A real CRI client: the `k8s-cri` crate's generated tonic gRPC clients (CRI `v1`, the API
//! kubelet speaks to containerd 1.6) over containerd's unix socket, made synchronous for the
//! tests with a current-thread tokio runtime of its own. Each method is one CRI call, built
//! the way kubelet builds it (`kuberuntime`): the pod's metadata, labels and annotations, the
//! log directory, the container's `terminationMessagePath` annotation and mount.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use tonic::transport::{Channel, Endpoint, Uri};

/// The CRI's answer to one call: the message, or the gRPC status (code and text).
pub type CriResult<T> = Result<T, tonic::Status>;

/// One connection to containerd's CRI (runtime and image services on one channel).
pub struct Cri {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl Cri {
    /// Connects to the CRI at `socket` (containerd's gRPC socket).
    pub fn connect(socket: &Path) -> Cri {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let path = socket.to_path_buf();
        let channel = rt
            .block_on(async move {
                // The URI is a placeholder: the connector dials the unix socket.
                Endpoint::try_from("http://[::]:50051")
                    .expect("endpoint")
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                        }
                    }))
                    .await
            })
            .expect("connecting to containerd's CRI socket");
        Cri {
            rt,
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        }
    }

    /// `Version` (kubelet's first call).
    pub fn version(&mut self) -> CriResult<VersionResponse> {
        let req = VersionRequest {
            version: "v1".into(),
        };
        Ok(self.rt.block_on(self.runtime.version(req))?.into_inner())
    }

    /// `ImageStatus` of `image` (kubelet asks before it pulls).
    pub fn image_status(&mut self, image: &str) -> CriResult<Option<Image>> {
        let req = ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        Ok(self
            .rt
            .block_on(self.images.image_status(req))?
            .into_inner()
            .image)
    }

    /// `RunPodSandbox` of `config` with `handler` (the RuntimeClass's handler); the pod id.
    pub fn run_pod(&mut self, config: &PodSandboxConfig, handler: &str) -> CriResult<String> {
        let req = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        };
        Ok(self
            .rt
            .block_on(self.runtime.run_pod_sandbox(req))?
            .into_inner()
            .pod_sandbox_id)
    }

    /// `PodSandboxStatus` of `pod`.
    pub fn pod_status(&mut self, pod: &str) -> CriResult<PodSandboxStatus> {
        let req = PodSandboxStatusRequest {
            pod_sandbox_id: pod.into(),
            verbose: false,
        };
        let resp = self.rt.block_on(self.runtime.pod_sandbox_status(req))?;
        resp.into_inner()
            .status
            .ok_or_else(|| tonic::Status::internal("PodSandboxStatus without a status"))
    }

    /// `CreateContainer` of `config` in `pod` (created from `sandbox`); the container id.
    pub fn create(
        &mut self,
        pod: &str,
        config: &ContainerConfig,
        sandbox: &PodSandboxConfig,
    ) -> CriResult<String> {
        let req = CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox.clone()),
        };
        Ok(self
            .rt
            .block_on(self.runtime.create_container(req))?
            .into_inner()
            .container_id)
    }

    /// `StartContainer`.
    pub fn start(&mut self, id: &str) -> CriResult<()> {
        let req = StartContainerRequest {
            container_id: id.into(),
        };
        self.rt.block_on(self.runtime.start_container(req))?;
        Ok(())
    }

    /// `ExecSync` of `cmd` in `id`, with a timeout in seconds.
    pub fn exec_sync(
        &mut self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> CriResult<ExecSyncResponse> {
        let req = ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout,
        };
        Ok(self.rt.block_on(self.runtime.exec_sync(req))?.into_inner())
    }

    /// `Exec` of `cmd` in `id` (stdout and stderr, no stdin, no tty): the streaming server's
    /// URL, which a client then opens ([`crate::stream::exec`]).
    pub fn exec(&mut self, id: &str, cmd: &[&str]) -> CriResult<String> {
        let req = ExecRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            tty: false,
            stdin: false,
            stdout: true,
            stderr: true,
        };
        Ok(self.rt.block_on(self.runtime.exec(req))?.into_inner().url)
    }

    /// `ContainerStatus` of `id`.
    pub fn status(&mut self, id: &str) -> CriResult<ContainerStatus> {
        let req = ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let resp = self.rt.block_on(self.runtime.container_status(req))?;
        resp.into_inner()
            .status
            .ok_or_else(|| tonic::Status::internal("ContainerStatus without a status"))
    }

    /// `ListContainers` of `pod` (kubelet's filter by sandbox).
    pub fn list(&mut self, pod: &str) -> CriResult<Vec<Container>> {
        let req = ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: pod.into(),
                ..Default::default()
            }),
        };
        Ok(self
            .rt
            .block_on(self.runtime.list_containers(req))?
            .into_inner()
            .containers)
    }

    /// `ContainerStats` of `id`.
    pub fn stats(&mut self, id: &str) -> CriResult<ContainerStats> {
        let req = ContainerStatsRequest {
            container_id: id.into(),
        };
        let resp = self.rt.block_on(self.runtime.container_stats(req))?;
        resp.into_inner()
            .stats
            .ok_or_else(|| tonic::Status::internal("ContainerStats without stats"))
    }

    /// `StopContainer` with kubelet's grace period in seconds.
    pub fn stop(&mut self, id: &str, timeout: i64) -> CriResult<()> {
        let req = StopContainerRequest {
            container_id: id.into(),
            timeout,
        };
        self.rt.block_on(self.runtime.stop_container(req))?;
        Ok(())
    }

    /// `RemoveContainer`.
    pub fn remove(&mut self, id: &str) -> CriResult<()> {
        let req = RemoveContainerRequest {
            container_id: id.into(),
        };
        self.rt.block_on(self.runtime.remove_container(req))?;
        Ok(())
    }

    /// `StopPodSandbox`.
    pub fn stop_pod(&mut self, pod: &str) -> CriResult<()> {
        let req = StopPodSandboxRequest {
            pod_sandbox_id: pod.into(),
        };
        self.rt.block_on(self.runtime.stop_pod_sandbox(req))?;
        Ok(())
    }

    /// `RemovePodSandbox`.
    pub fn remove_pod(&mut self, pod: &str) -> CriResult<()> {
        let req = RemovePodSandboxRequest {
            pod_sandbox_id: pod.into(),
        };
        self.rt.block_on(self.runtime.remove_pod_sandbox(req))?;
        Ok(())
    }
}

/// An `ImageSpec` naming `image`.
pub fn image_spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.into(),
        ..Default::default()
    }
}

/// A pod as kubelet describes it to `RunPodSandbox`: metadata, kubelet's labels, the pod's
/// log directory (`log_dir`, which kubelet creates), a hostname, and the pod network (or the
/// node's, for `hostNetwork`).
pub fn pod_config(name: &str, uid: &str, log_dir: &Path, host_network: bool) -> PodSandboxConfig {
    let labels = HashMap::from([
        ("io.kubernetes.pod.name".to_string(), name.to_string()),
        (
            "io.kubernetes.pod.namespace".to_string(),
            "default".to_string(),
        ),
        ("io.kubernetes.pod.uid".to_string(), uid.to_string()),
    ]);
    let network = if host_network {
        NamespaceMode::Node
    } else {
        NamespaceMode::Pod
    };
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: if host_network {
            String::new()
        } else {
            name.into()
        },
        log_directory: log_dir.to_string_lossy().into_owned(),
        labels,
        annotations: HashMap::from([(
            "kubernetes.io/config.source".to_string(),
            "api".to_string(),
        )]),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: network.into(),
                    pid: NamespaceMode::Pod.into(),
                    ipc: NamespaceMode::Pod.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container as kubelet describes it to `CreateContainer`: `command` (the pod spec's
/// `command`, replacing the image's entrypoint), its log path (relative to the pod's log
/// directory), kubelet's annotations, and `mounts`.
pub fn container_config(
    name: &str,
    image: &str,
    command: &[&str],
    mounts: Vec<Mount>,
) -> ContainerConfig {
    let annotations = HashMap::from([
        (
            "io.kubernetes.container.restartCount".to_string(),
            "0".to_string(),
        ),
        (
            "io.kubernetes.container.terminationMessagePath".to_string(),
            TERMINATION_LOG.to_string(),
        ),
        (
            "io.kubernetes.container.terminationMessagePolicy".to_string(),
            "File".to_string(),
        ),
    ]);
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(image_spec(image)),
        command: command.iter().map(|s| s.to_string()).collect(),
        envs: vec![KeyValue {
            key: "POD_NAME".into(),
            value: name.into(),
        }],
        mounts,
        labels: HashMap::from([("io.kubernetes.container.name".to_string(), name.to_string())]),
        annotations,
        log_path: format!("{name}/0.log"),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Pod.into(),
                    pid: NamespaceMode::Container.into(),
                    ipc: NamespaceMode::Pod.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Where a container writes its termination message (kubelet's default
/// `terminationMessagePath`).
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// A writable bind (kubelet's `hostPath`, `emptyDir` and file mounts are all `rw` binds).
pub fn rw_mount(host: &Path, container: &str) -> Mount {
    Mount {
        container_path: container.into(),
        host_path: host.to_string_lossy().into_owned(),
        ..Default::default()
    }
}

/// The termination message kubelet would report for an exited container `status`, worked
/// out as kubelet's `getTerminationMessage` does: the runtime's `message`, then, from the mount
/// whose container path is the `terminationMessagePath` annotation, the last 4 KiB of its
/// *host* file (kubelet reads the host file; it never asks the runtime for the text).
pub fn kubelet_termination_message(status: &ContainerStatus) -> String {
    let path = status
        .annotations
        .get("io.kubernetes.container.terminationMessagePath")
        .map(String::as_str)
        .unwrap_or(TERMINATION_LOG);
    let from_file = status
        .mounts
        .iter()
        .find(|m| m.container_path == path)
        .and_then(|m| std::fs::read(PathBuf::from(&m.host_path)).ok())
        .map(|data| {
            let tail = &data[data.len().saturating_sub(4096)..];
            String::from_utf8_lossy(tail).into_owned()
        })
        .unwrap_or_default();
    match (status.message.is_empty(), from_file.is_empty()) {
        (_, true) => status.message.clone(),
        (true, false) => from_file,
        (false, false) => format!("{}: {from_file}", status.message),
    }
}
