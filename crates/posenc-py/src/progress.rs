//! Progress and Ctrl-C for long calls that run with the GIL released.
//!
//! A [`Watch`] is handed to the Rust code as its progress callback. Each
//! tick takes the GIL for a moment, lets Python handle pending signals
//! (`KeyboardInterrupt` from Ctrl-C) and calls the user's `progress`
//! callable, if any, with `(done, total, what)`. When either raises, the
//! tick answers "stop", the Rust call returns early, and [`Watch::finish`]
//! raises that exception instead of the call's result.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// The user's progress callable and the first exception seen.
pub struct Watch {
    callback: Option<Py<PyAny>>,
    error: Mutex<Option<PyErr>>,
    stop: AtomicBool,
    last_signal_check: Mutex<Instant>,
    /// The last `(done, total)` passed to the callback: a repeated one (a
    /// forward pass between a layer's parts) only checks for Ctrl-C.
    last_report: Mutex<Option<(usize, usize)>>,
}

impl Watch {
    /// A watch over `callback` as `posenc._progress.resolve` reads it (the
    /// one reading of `progress=`, `posenc.hf`'s too): the user's callable;
    /// `None` or `True` for the default display (a tqdm bar when tqdm is
    /// installed); `False` for none (signals only).
    ///
    /// # Errors
    /// `PosencError` for anything else than a callable, a bool or `None`
    /// (before the call starts, not at its first report).
    pub fn new(callback: Option<Py<PyAny>>) -> PyResult<Watch> {
        let callback = Python::attach(|py| -> PyResult<Option<Py<PyAny>>> {
            let f = py
                .import("posenc._progress")?
                .call_method1("resolve", (callback,))?;
            Ok((!f.is_none()).then(|| f.unbind()))
        })?;
        Ok(Watch {
            callback,
            error: Mutex::new(None),
            stop: AtomicBool::new(false),
            last_signal_check: Mutex::new(Instant::now()),
            last_report: Mutex::new(None),
        })
    }

    /// Whether the call should stop (an exception is pending).
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The flag the Rust code polls (true: stop).
    pub fn flag(&self) -> &AtomicBool {
        &self.stop
    }

    /// Reports `done` of `total` steps of `what`; returns `false` when the
    /// call must stop (Ctrl-C, or the callback raised). The callback sees
    /// each count once: a repeat of the last `(done, total)` only checks
    /// for Ctrl-C.
    pub fn tick(&self, done: usize, total: usize, what: &str) -> bool {
        if self.stopped() {
            return false;
        }
        let new = {
            let mut last = self.last_report.lock().unwrap_or_else(|e| e.into_inner());
            let same = *last == Some((done, total));
            *last = Some((done, total));
            !same
        };
        Python::attach(|py| {
            let r = py.check_signals().and_then(|_| match &self.callback {
                Some(cb) if new => cb.call1(py, (done, total, what)).map(|_| ()),
                _ => Ok(()),
            });
            if let Err(e) = r {
                self.fail(e);
            }
        });
        !self.stopped()
    }

    /// Checks for Ctrl-C at most every 20 ms (for loops with many small
    /// steps); returns `false` when the call must stop.
    pub fn poll(&self) -> bool {
        if self.stopped() {
            return false;
        }
        {
            let mut last = self
                .last_signal_check
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if last.elapsed() < Duration::from_millis(20) {
                return true;
            }
            *last = Instant::now();
        }
        Python::attach(|py| {
            if let Err(e) = py.check_signals() {
                self.fail(e);
            }
        });
        !self.stopped()
    }

    fn fail(&self, e: PyErr) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    /// The call's result, or the exception that stopped it (which wins
    /// over the error the stopped call returned).
    pub fn finish<T>(self, r: PyResult<T>) -> PyResult<T> {
        let pending = self.error.into_inner().unwrap_or_else(|e| e.into_inner());
        match pending {
            Some(e) => Err(e),
            None => r,
        }
    }
}
