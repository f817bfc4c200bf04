//! The tools on a sandbox's files and ports: `sandbox_read_file`, `sandbox_write_file`,
//! `sandbox_list_files`, `sandbox_serve`. Paths are the guest's rule (`vm_sandbox::confine`:
//! relative to /work or absolute under it, no `..`), checked here and again by the agent.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use vm_sandbox::agent::ChunkSink;
use vm_sandbox::{PublishSpec, Readiness, ServeSpec, confine};

use super::calls::{Calls, cancelled, ok, reply};
use super::fault::Fault;
use super::output::Bounded;
use super::tools::{Encoding, ListParams, ReadParams, ServeParams, WriteParams};
use rmcp::model::CallToolResult;

/// The largest file `sandbox_read_file` streams through (its head is kept, the rest
/// counted); a larger one is refused with its size.
const MAX_READ: u64 = 64 << 20;
/// The most paths `sandbox_list_files` returns.
const MAX_LISTED: usize = 10_000;
/// How long `sandbox_serve` waits for readiness when the call does not say.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

impl ChunkSink for Bounded {
    async fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.push(data);
        Ok(())
    }
}

/// A path a call gives, as the guest's rule takes it (relative to the sandbox's root).
fn in_root(root: &str, path: &str, field: &str) -> Result<String, Fault> {
    confine::in_root(root, path).map_err(|e| Fault::refused(field, e))
}

impl Calls {
    /// `sandbox_read_file`.
    pub async fn read(&self, p: ReadParams) -> CallToolResult {
        reply(self.read_inner(p).await)
    }

    async fn read_inner(&self, p: ReadParams) -> Result<CallToolResult, Fault> {
        let target = self.session.find(&p.name)?;
        let guest = target.guest();
        let rel = in_root(guest.root(), &p.path, "path")?;
        let mut head = Bounded::new(self.host.max_output);
        guest
            .read_file_to(&rel, MAX_READ, &mut head)
            .await
            .map_err(|e| Fault::from_error(&e, 0))?;
        let (content, encoding) = match std::str::from_utf8(head.bytes()) {
            Ok(t) => (t.to_string(), "utf8"),
            // A cut may split a character: the text stays text up to it.
            Err(e) if head.truncated() && e.error_len().is_none() => {
                (head.text_up_to(e.valid_up_to()), "utf8")
            }
            Err(_) => (BASE64.encode(head.bytes()), "base64"),
        };
        let mut text = match encoding {
            "utf8" => content.clone(),
            _ => format!("(binary, {} bytes, base64)\n{content}", head.total()),
        };
        if let Some(note) = head.note(&p.path) {
            text.push_str(&format!("\n{note}"));
        }
        Ok(ok(
            text,
            json!({
                "name": p.name,
                "path": p.path,
                "content": content,
                "encoding": encoding,
                "bytes": head.total(),
                "truncated": head.truncated(),
            }),
        ))
    }

    /// `sandbox_write_file`.
    pub async fn write(&self, p: WriteParams) -> CallToolResult {
        reply(self.write_inner(p).await)
    }

    async fn write_inner(&self, p: WriteParams) -> Result<CallToolResult, Fault> {
        let data = match p.encoding {
            Encoding::Utf8 => p.content.into_bytes(),
            Encoding::Base64 => BASE64
                .decode(p.content.as_bytes())
                .map_err(|e| Fault::refused("content", format!("not base64: {e}")))?,
        };
        let target = self.session.find(&p.name)?;
        let guest = target.guest();
        let rel = in_root(guest.root(), &p.path, "path")?;
        guest
            .write_file(&rel, &data)
            .await
            .map_err(|e| Fault::from_error(&e, 0))?;
        let path = format!("{}/{rel}", guest.root().trim_end_matches('/'));
        Ok(ok(
            format!("wrote {} bytes to {path}", data.len()),
            json!({"name": p.name, "path": path, "bytes": data.len()}),
        ))
    }

    /// `sandbox_list_files`.
    pub async fn list_files(&self, p: ListParams) -> CallToolResult {
        reply(self.list_files_inner(p).await)
    }

    async fn list_files_inner(&self, p: ListParams) -> Result<CallToolResult, Fault> {
        let target = self.session.find(&p.name)?;
        let guest = target.guest();
        let root = guest.root().trim_end_matches('/');
        let rel = match p.dir.as_deref().map(|d| d.trim_end_matches('/')) {
            None | Some("" | ".") => String::new(),
            Some(d) if d == root => String::new(),
            Some(d) => in_root(guest.root(), d, "dir")?,
        };
        let mut files = guest
            .walk(&rel)
            .await
            .map_err(|e| Fault::from_error(&e, 0))?;
        let total = files.len();
        files.truncate(MAX_LISTED);
        let mut text = match files.is_empty() {
            true => format!("no files under {root}/{rel}"),
            false => files.join("\n"),
        };
        if total > files.len() {
            text.push_str(&format!(
                "\n[{total} files, the first {} shown]",
                files.len()
            ));
        }
        Ok(ok(
            text,
            json!({"name": p.name, "root": root, "files": files, "total": total}),
        ))
    }

    /// `sandbox_serve`.
    pub async fn serve(&self, p: ServeParams, ct: CancellationToken) -> CallToolResult {
        reply(self.serve_inner(p, &ct).await)
    }

    async fn serve_inner(
        &self,
        p: ServeParams,
        ct: &CancellationToken,
    ) -> Result<CallToolResult, Fault> {
        if p.port == 0 {
            return Err(Fault::refused(
                "port",
                "0 refused; give the guest port the server listens on",
            ));
        }
        if let Some(path) = &p.ready_path {
            Readiness::check_path(path).map_err(|e| Fault::refused("ready_path", e))?;
        }
        let timeout = match &p.ready_timeout {
            Some(t) => t.duration("ready_timeout")?,
            None => READY_TIMEOUT,
        };
        let target = self.session.find(&p.name)?;
        let spec = ServeSpec {
            argv: vec!["/bin/sh".into(), "-c".into(), p.command.clone()],
            // Always a free port on the host's loopback: the host decides where it listens.
            publish: vec![PublishSpec::loopback(0, p.port)],
        };
        let serving = target
            .guest()
            .serve(spec)
            .await
            .map_err(|e| Fault::from_error(&e, 0))?;
        let ready = Readiness {
            http_path: p.ready_path.clone(),
            timeout,
        };
        let waited = tokio::select! {
            r = serving.wait_ready(&ready) => r,
            () = ct.cancelled() => {
                let _ = serving.stop().await;
                return Err(cancelled());
            }
        };
        if let Err(e) = waited {
            let tail = serving.output();
            let _ = serving.stop().await;
            let mut message = vm_error_chain::error_chain(&e);
            // The server's retained output tail, its last 2000 characters at most.
            let start = tail.char_indices().rev().nth(1999).map_or(0, |(i, _)| i);
            if !tail[start..].trim().is_empty() {
                message.push_str(&format!("; its output: {}", tail[start..].trim()));
            }
            return Err(Fault::failed(message));
        }
        let url = serving.published()[0].url();
        self.session.add_server(&target, serving);
        Ok(ok(
            format!("serving guest port {} of {} at {url}", p.port, p.name),
            json!({"name": p.name, "port": p.port, "url": url}),
        ))
    }
}
