//! Running the named cases of one scenario against one guest, and error context.

use std::error::Error;
use std::future::Future;
use std::time::{Duration, Instant};

/// Default bound on one case.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(180);

/// The cases of one scenario on one driver: each runs to the end (under a timeout) and its
/// outcome is printed; [`Cases::finish`] fails if any failed.
#[derive(Debug)]
pub struct Cases {
    scenario: String,
    driver: &'static str,
    failures: Vec<String>,
    passed: usize,
}

impl Cases {
    pub fn new(scenario: &str, driver: &'static str) -> Cases {
        Cases {
            scenario: scenario.into(),
            driver,
            failures: Vec::new(),
            passed: 0,
        }
    }

    /// Runs one case under [`CASE_TIMEOUT`].
    pub async fn run(&mut self, case: &str, fut: impl Future<Output = Result<(), String>>) {
        self.run_within(case, CASE_TIMEOUT, fut).await;
    }

    /// Runs one case under `limit`.
    pub async fn run_within(
        &mut self,
        case: &str,
        limit: Duration,
        fut: impl Future<Output = Result<(), String>>,
    ) {
        let start = Instant::now();
        let outcome = match tokio::time::timeout(limit, fut).await {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {limit:?}")),
        };
        let took = start.elapsed().as_secs_f64();
        let (scenario, driver) = (&self.scenario, self.driver);
        match outcome {
            Ok(()) => {
                self.passed += 1;
                eprintln!("  ok   {scenario}/{case} [{driver}] ({took:.1} s)");
            }
            Err(e) => {
                eprintln!("  FAIL {scenario}/{case} [{driver}] ({took:.1} s): {e}");
                self.failures.push(format!("{case}: {e}"));
            }
        }
    }

    /// Records a failure that happened outside a case (boot, teardown).
    pub fn fail(&mut self, what: &str, e: String) {
        eprintln!("  FAIL {}/{what} [{}]: {e}", self.scenario, self.driver);
        self.failures.push(format!("{what}: {e}"));
    }

    /// `Ok` when every case passed, else every failure.
    pub fn finish(self) -> Result<(), String> {
        if self.failures.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} of {} cases failed:\n  {}",
                self.failures.len(),
                self.failures.len() + self.passed,
                self.failures.join("\n  ")
            ))
        }
    }
}

pub use vm_error_chain::error_chain;

/// Adds what was being done to an error, with its whole chain.
pub trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: Error + 'static> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {}", error_chain(&e)))
    }
}
