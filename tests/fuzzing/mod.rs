//! The runner the fuzz tests of every package share (each includes this
//! file with `#[path]`): it runs generated inputs, turns a panic into a
//! failed case, and records how many cases ran under the target directory,
//! where `.ci/run` adds up every package's counts.

use std::fmt::Debug;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Run `cases` generated inputs through `check`. A panic fails the case
/// like an assertion does (proptest then shrinks it); either way the number
/// of cases run and of panics is printed and written to
/// `CARGO_TARGET_TMPDIR/fuzz/<package>-<target>`.
pub(crate) fn fuzz<S>(
    target: &str,
    cases: u32,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let package = env!("CARGO_PKG_NAME");
    let ran = AtomicU64::new(0);
    let panics = AtomicU64::new(0);
    let started = Instant::now();
    let mut runner = TestRunner::new(Config {
        cases,
        // Regressions are kept as plain tests beside the fuzz targets, not
        // in files beside the sources.
        failure_persistence: None,
        max_shrink_iters: 512,
        ..Config::default()
    });
    let result = runner.run(&strategy, |input| {
        ran.fetch_add(1, Ordering::Relaxed);
        std::panic::catch_unwind(AssertUnwindSafe(|| check(input))).unwrap_or_else(|panic| {
            panics.fetch_add(1, Ordering::Relaxed);
            let text = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            Err(TestCaseError::fail(format!("panicked: {text}")))
        })
    });
    let (ran, panics) = (ran.into_inner(), panics.into_inner());
    let took = started.elapsed().as_secs_f64();
    println!("fuzz: {package} {target}: {ran} cases, {panics} panics ({took:.1} s)");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz");
    std::fs::create_dir_all(&dir).expect("the fuzz counts' directory");
    std::fs::write(
        dir.join(format!("{package}-{target}")),
        format!("{ran} {panics}\n"),
    )
    .expect("a fuzz count");
    if let Err(failure) = result {
        panic!("{target}: {failure}");
    }
}

/// Fail the case with `what` unless `ok`.
pub(crate) fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if ok {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}
