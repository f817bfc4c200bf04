//! [`Stream`]: a guest command's events as Python pulls them. `next(wait)` returns within
//! `wait` seconds, with an event or `("wait", None)`, so the Python side handles its signals
//! between calls; `cancel` kills the command's whole process tree (what `vm exec` does on
//! Ctrl-C). A command that could not be started because it was not found or cannot be
//! executed is a result, as with `vm exec`: its stderr says why and it exits 127 or 126.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use vm_sandbox::agent::{ExecEvent, ExecStream, ExitStatus};
use vm_sandbox::{Guest, Run};
use vm_sync::Lock;

use crate::failure::{Failure, command_not_run};
use crate::{blocking, runtime};

/// How long a cancel may take before the connection is dropped (which also kills the tree).
const CANCEL_GRACE: Duration = Duration::from_secs(5);

enum State {
    Live(ExecStream),
    /// Events made here (a command that was not run), then the end.
    Made(VecDeque<ExecEvent>),
    Done,
}

/// A running guest command (see the module docs).
#[pyclass(module = "vm_sandbox._native", frozen)]
pub struct Stream {
    state: Mutex<State>,
}

impl Stream {
    pub fn start(vm: &Guest, run: Run) -> Result<Stream, Failure> {
        let state = match runtime().block_on(vm.exec_stream(run)) {
            Ok(s) => State::Live(s),
            Err(e) => match not_run(&e) {
                Some(events) => State::Made(events),
                None => return Err(e.into()),
            },
        };
        Ok(Stream {
            state: Mutex::new(state),
        })
    }
}

/// The events of a command the agent could not start: `vm: <why>` on stderr, exit 127/126.
fn not_run(e: &(dyn std::error::Error + 'static)) -> Option<VecDeque<ExecEvent>> {
    let (code, message) = command_not_run(e)?;
    let line = format!("vm: {}\n", message.replace('\n', " "));
    let status = ExitStatus {
        code: Some(code),
        signal: None,
        timed_out: false,
    };
    Some(VecDeque::from([
        ExecEvent::Stderr(line.into_bytes()),
        ExecEvent::Exit(status),
    ]))
}

/// What `next` hands Python.
enum Next {
    Event(ExecEvent),
    Wait,
    End,
}

#[pymethods]
impl Stream {
    /// The next event, waiting at most `wait` seconds: `("stdout", bytes)`,
    /// `("stderr", bytes)`, `("exit", (code, signal, timed_out))` (always the last),
    /// `("wait", None)` when nothing came in time, `("end", None)` after the exit.
    #[pyo3(signature = (wait=0.2))]
    fn next<'py>(&self, py: Python<'py>, wait: f64) -> PyResult<(&'static str, Py<PyAny>)> {
        let wait = Duration::try_from_secs_f64(wait).unwrap_or(Duration::from_millis(200));
        let next = blocking(py, || {
            let mut state = self.state.locked();
            let next = match &mut *state {
                State::Done => Next::End,
                State::Made(events) => events.pop_front().map_or(Next::End, Next::Event),
                // `ExecStream::next` is cancel-safe: a timed-out wait loses nothing.
                State::Live(s) => {
                    match runtime().block_on(async { tokio::time::timeout(wait, s.next()).await }) {
                        Err(_) => Next::Wait,
                        Ok(Ok(Some(ev))) => Next::Event(ev),
                        Ok(Ok(None)) => {
                            return Err(Failure::new(
                                crate::failure::Kind::GuestError,
                                "the guest closed the command's stream without an exit status",
                            ));
                        }
                        // Not found / not executable: a result, as at the start.
                        Ok(Err(e)) => match not_run(&e) {
                            Some(mut events) => {
                                let first = events.pop_front().map_or(Next::End, Next::Event);
                                *state = State::Made(events);
                                first
                            }
                            None => {
                                *state = State::Done;
                                return Err(Failure::from_error(&e));
                            }
                        },
                    }
                }
            };
            if matches!(next, Next::Event(ExecEvent::Exit(_)) | Next::End) {
                *state = State::Done;
            }
            Ok(next)
        })?;
        Ok(match next {
            Next::Wait => ("wait", py.None()),
            Next::End => ("end", py.None()),
            Next::Event(ExecEvent::Stdout(d)) => {
                ("stdout", PyBytes::new(py, &d).into_any().unbind())
            }
            Next::Event(ExecEvent::Stderr(d)) => {
                ("stderr", PyBytes::new(py, &d).into_any().unbind())
            }
            Next::Event(ExecEvent::Exit(s)) => {
                let status = (s.code, s.signal, s.timed_out).into_pyobject(py)?;
                ("exit", status.into_any().unbind())
            }
        })
    }

    /// Kills the command's whole process tree; its final status as `(code, signal,
    /// timed_out)`, or None when it had already ended or the cancel exchange failed (the
    /// connection is dropped then, which kills the tree from the agent's side).
    fn cancel(&self, py: Python<'_>) -> Option<(Option<i32>, Option<i32>, bool)> {
        py.detach(|| {
            let mut state = self.state.locked();
            let State::Live(s) = std::mem::replace(&mut *state, State::Done) else {
                return None;
            };
            match runtime().block_on(async { tokio::time::timeout(CANCEL_GRACE, s.cancel()).await })
            {
                Ok(Ok(st)) => Some((st.code, st.signal, st.timed_out)),
                _ => None,
            }
        })
    }
}
