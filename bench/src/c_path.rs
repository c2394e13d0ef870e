//! The C baseline: `c/graph_bench.c`, compiled by `build.rs` against the toolkit's headers and
//! linked into this binary, called through its small C interface. It writes the workloads with
//! the runtime API, as the Programming Guide does; this module only passes shapes in and reads
//! times, footprints and errors out.
//!
//! A build without toolkit headers (or without a runtime library to link) has no C baseline:
//! [`CPath::new`] then says why, and the benchmark stops there.

use crate::footprint::Mem;
use crate::workload::{
    BenchError, CycleRun, GraphRun, Mode, PathId, Result, Shape, SteadyRun, StreamRun, UpdateRun,
    Workloads,
};

/// What `build.rs` did with the C file, in words.
pub const BUILD_NOTE: &str = env!("CUDA_GRAPH_BENCH_C");

#[cfg(not(cuda_graph_bench_no_c))]
mod imp {
    use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_ulonglong};
    use std::ptr::null_mut;
    use std::time::Duration;

    use super::*;
    use crate::workload::verify_update;

    /// `gb_error`.
    #[repr(C)]
    struct GbError {
        call: *const c_char,
        code: c_int,
        name: *const c_char,
        text: *const c_char,
        line: c_int,
    }

    impl GbError {
        fn new() -> GbError {
            GbError {
                call: std::ptr::null(),
                code: 0,
                name: std::ptr::null(),
                text: std::ptr::null(),
                line: 0,
            }
        }

        fn into_error(self) -> BenchError {
            let text = |p: *const c_char, fallback: &str| {
                if p.is_null() {
                    fallback.to_string()
                } else {
                    // SAFETY: the C side stores static NUL-terminated strings (literals, and
                    // what cudaGetErrorName/cudaGetErrorString return).
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            };
            BenchError(format!(
                "{} failed: {}: {} (c/graph_bench.c:{})",
                text(self.call, "a runtime call"),
                text(self.name, &format!("cudaError {}", self.code)),
                text(self.text, "no description"),
                self.line
            ))
        }
    }

    /// `gb_shape`.
    #[repr(C)]
    struct GbShape {
        elements: c_ulonglong,
        grid: c_uint,
        block: c_uint,
    }

    impl From<Shape> for GbShape {
        fn from(s: Shape) -> GbShape {
            GbShape {
                elements: s.elements,
                grid: s.grid,
                block: s.block,
            }
        }
    }

    /// `gb_graph_times`.
    #[repr(C)]
    #[derive(Default)]
    struct GbGraphTimes {
        steady_enqueue_ns: u64,
        steady_ns: u64,
    }

    /// `gb_cycle_times`.
    #[repr(C)]
    #[derive(Default)]
    struct GbCycleTimes {
        build_ns: u64,
        instantiate_ns: u64,
    }

    /// `gb_update_times`.
    #[repr(C)]
    #[derive(Default)]
    struct GbUpdateTimes {
        build_ns: u64,
        update_ns: u64,
        instantiate_ns: u64,
    }

    /// `gb_stream_times`.
    #[repr(C)]
    #[derive(Default)]
    struct GbStreamTimes {
        enqueue_ns: u64,
        total_ns: u64,
    }

    /// `gb_ctx`, opaque here.
    #[repr(C)]
    struct GbCtx {
        _opaque: [u8; 0],
    }

    // The C interface of c/graph_bench.c; the library is linked by build.rs.
    unsafe extern "C" {
        fn gb_layout(sizes: *mut c_ulonglong);
        fn gb_open(
            ptx: *const c_char,
            device: c_int,
            ctx: *mut *mut GbCtx,
            err: *mut GbError,
        ) -> c_int;
        fn gb_close(ctx: *mut GbCtx, err: *mut GbError) -> c_int;
        fn gb_runtime_version(version: *mut c_int, err: *mut GbError) -> c_int;
        fn gb_graph_chain(
            ctx: *mut GbCtx,
            mode: c_int,
            k: c_uint,
            shape: *const GbShape,
            first_launch_ns: *mut u64,
            err: *mut GbError,
        ) -> c_int;
        fn gb_steady(
            ctx: *mut GbCtx,
            launches: c_uint,
            times: *mut GbGraphTimes,
            err: *mut GbError,
        ) -> c_int;
        fn gb_launch_sync(ctx: *mut GbCtx, iters: c_uint, ns: *mut u64, err: *mut GbError)
        -> c_int;
        fn gb_release_chain(ctx: *mut GbCtx, err: *mut GbError) -> c_int;
        fn gb_build_instantiate(
            ctx: *mut GbCtx,
            mode: c_int,
            k: c_uint,
            shape: *const GbShape,
            times: *mut GbCycleTimes,
            err: *mut GbError,
        ) -> c_int;
        fn gb_stream_chain(
            ctx: *mut GbCtx,
            k: c_uint,
            shape: *const GbShape,
            iters: c_uint,
            times: *mut GbStreamTimes,
            err: *mut GbError,
        ) -> c_int;
        fn gb_update_chain(
            ctx: *mut GbCtx,
            k: c_uint,
            shape: *const GbShape,
            err: *mut GbError,
        ) -> c_int;
        fn gb_update_step(
            ctx: *mut GbCtx,
            step: c_uint,
            host: *mut c_uint,
            times: *mut GbUpdateTimes,
            err: *mut GbError,
        ) -> c_int;
        fn gb_release_update(ctx: *mut GbCtx, err: *mut GbError) -> c_int;
        fn gb_fp_address_reuse(
            ctx: *mut GbCtx,
            bytes: usize,
            steps: *mut Mem,
            max_steps: c_uint,
            nsteps: *mut c_uint,
            same_address: *mut c_int,
            err: *mut GbError,
        ) -> c_int;
        fn gb_fp_one_stream(
            ctx: *mut GbCtx,
            shape: *const GbShape,
            spins: c_ulonglong,
            steps: *mut Mem,
            max_steps: c_uint,
            nsteps: *mut c_uint,
            distinct: *mut c_int,
            err: *mut GbError,
        ) -> c_int;
        fn gb_fp_concurrent(
            ctx: *mut GbCtx,
            shape: *const GbShape,
            spins: c_ulonglong,
            steps: *mut Mem,
            max_steps: c_uint,
            nsteps: *mut c_uint,
            err: *mut GbError,
        ) -> c_int;
        fn gb_fp_unfreed(
            ctx: *mut GbCtx,
            bytes: usize,
            steps: *mut Mem,
            max_steps: c_uint,
            nsteps: *mut c_uint,
            err: *mut GbError,
        ) -> c_int;
    }

    /// Runs one C function with an error record; `Err` carries what it recorded.
    fn call(f: impl FnOnce(*mut GbError) -> c_int) -> Result<()> {
        let mut err = GbError::new();
        if f(&mut err) == 0 {
            Ok(())
        } else {
            Err(err.into_error())
        }
    }

    /// Room for the steps of any scenario.
    const MAX_STEPS: usize = 32;

    /// The C baseline's context: device, kernels, stream (`gb_ctx`).
    #[derive(Debug)]
    pub struct CPath {
        ctx: *mut GbCtx,
        /// What `gb_update_chain` set up: its chain length, and host room for `gb_update_step`
        /// to read the buffer back into (`shape.elements` values).
        update: Option<(u32, Vec<u32>)>,
    }

    /// Checks this module's copies of the C structures against the C compiler's sizes.
    pub(super) fn check_layout() -> Result<()> {
        let mut sizes = [0 as c_ulonglong; 7];
        // SAFETY: the array has the seven entries gb_layout writes.
        unsafe { gb_layout(sizes.as_mut_ptr()) };
        let ours = [
            size_of::<GbError>(),
            size_of::<GbShape>(),
            size_of::<GbGraphTimes>(),
            size_of::<GbStreamTimes>(),
            size_of::<Mem>(),
            size_of::<GbCycleTimes>(),
            size_of::<GbUpdateTimes>(),
        ]
        .map(|s| s as c_ulonglong);
        if sizes == ours {
            Ok(())
        } else {
            Err(BenchError(format!(
                "the C structures (gb_error, gb_shape, gb_graph_times, gb_stream_times, gb_mem, gb_cycle_times, gb_update_times) have sizes {sizes:?} in c/graph_bench.c but {ours:?} in src/c_path.rs"
            )))
        }
    }

    impl CPath {
        /// `gb_open`: selects device `ordinal`, loads the kernels from the PTX, makes a stream.
        pub fn new(ordinal: usize) -> Result<CPath> {
            check_layout()?;
            let ptx = CString::new(cuda_graph::kernels::PTX)
                .map_err(|_| BenchError("the PTX contains a NUL byte".into()))?;
            let mut ctx = null_mut();
            call(|err| {
                // SAFETY: the PTX is NUL-terminated and outlives the call; out-pointers valid.
                unsafe { gb_open(ptx.as_ptr(), ordinal as c_int, &mut ctx, err) }
            })?;
            Ok(CPath { ctx, update: None })
        }

        /// The runtime's version (`cudaRuntimeGetVersion`), e.g. 13000.
        pub fn runtime_version(&self) -> Result<i32> {
            let mut version = 0;
            // SAFETY: valid out-pointers.
            call(|err| unsafe { gb_runtime_version(&mut version, err) })?;
            Ok(version)
        }

        fn steps(
            &mut self,
            f: impl FnOnce(*mut GbCtx, *mut Mem, c_uint, *mut c_uint, *mut GbError) -> c_int,
        ) -> Result<Vec<Mem>> {
            let mut steps = vec![Mem::default(); MAX_STEPS];
            let mut count: c_uint = 0;
            let ctx = self.ctx;
            call(|err| {
                f(
                    ctx,
                    steps.as_mut_ptr(),
                    MAX_STEPS as c_uint,
                    &mut count,
                    err,
                )
            })?;
            steps.truncate(count as usize);
            Ok(steps)
        }

        /// `gb_fp_address_reuse`: the steps, and whether the two allocations shared an address.
        pub fn address_reuse(&mut self, bytes: usize) -> Result<(Vec<Mem>, bool)> {
            let mut same = 0;
            let steps = self.steps(|ctx, steps, max, n, err| {
                // SAFETY: `steps` has room for `max` entries; the other pointers are valid.
                unsafe { gb_fp_address_reuse(ctx, bytes, steps, max, n, &mut same, err) }
            })?;
            Ok((steps, same != 0))
        }

        /// `gb_fp_one_stream`: the steps, and whether the eight graphs' addresses all differ.
        pub fn one_stream(&mut self, shape: Shape, spins: u64) -> Result<(Vec<Mem>, bool)> {
            let shape = GbShape::from(shape);
            let mut distinct = 0;
            let steps = self.steps(|ctx, steps, max, n, err| {
                // SAFETY: as above.
                unsafe { gb_fp_one_stream(ctx, &shape, spins, steps, max, n, &mut distinct, err) }
            })?;
            Ok((steps, distinct != 0))
        }

        /// `gb_fp_concurrent`: the steps.
        pub fn concurrent(&mut self, shape: Shape, spins: u64) -> Result<Vec<Mem>> {
            let shape = GbShape::from(shape);
            self.steps(|ctx, steps, max, n, err| {
                // SAFETY: as above.
                unsafe { gb_fp_concurrent(ctx, &shape, spins, steps, max, n, err) }
            })
        }

        /// `gb_fp_unfreed`: the steps.
        pub fn unfreed(&mut self, bytes: usize) -> Result<Vec<Mem>> {
            self.steps(|ctx, steps, max, n, err| {
                // SAFETY: as above.
                unsafe { gb_fp_unfreed(ctx, bytes, steps, max, n, err) }
            })
        }

        /// `gb_close`, reporting an error (dropping closes too, silently).
        pub fn close(mut self) -> Result<()> {
            let ctx = std::mem::replace(&mut self.ctx, null_mut());
            // SAFETY: `ctx` came from gb_open and is closed once (Drop sees null).
            call(|err| unsafe { gb_close(ctx, err) })
        }
    }

    impl Drop for CPath {
        fn drop(&mut self) {
            if !self.ctx.is_null() {
                let mut err = GbError::new();
                // SAFETY: `ctx` came from gb_open and is closed once.
                let _ = unsafe { gb_close(self.ctx, &mut err) };
            }
        }
    }

    /// The C file's `GB_EXPLICIT`, `GB_CAPTURE`, `GB_ESCAPING`.
    fn c_mode(mode: Mode) -> c_int {
        match mode {
            Mode::Explicit => 0,
            Mode::Capture => 1,
            Mode::Escaping => 2,
        }
    }

    fn ns(v: u64) -> Duration {
        Duration::from_nanos(v)
    }

    impl Workloads for CPath {
        fn id(&self) -> PathId {
            PathId::C
        }

        fn graph_chain(&mut self, mode: Mode, k: u32, shape: Shape) -> Result<GraphRun> {
            let shape = GbShape::from(shape);
            let mut first = 0;
            let mode = c_mode(mode);
            let ctx = self.ctx;
            call(|err| {
                // SAFETY: the context is open; the pointers are valid for the call.
                unsafe { gb_graph_chain(ctx, mode, k, &shape, &mut first, err) }
            })?;
            Ok(GraphRun {
                check: None,
                first_launch: ns(first),
            })
        }

        fn steady(&mut self, launches: u32) -> Result<SteadyRun> {
            let mut t = GbGraphTimes::default();
            let ctx = self.ctx;
            // SAFETY: the context is open; the pointers are valid for the call.
            call(|err| unsafe { gb_steady(ctx, launches, &mut t, err) })?;
            Ok(SteadyRun {
                enqueue: ns(t.steady_enqueue_ns),
                total: ns(t.steady_ns),
            })
        }

        fn launch_sync(&mut self, iters: u32) -> Result<Duration> {
            let mut t = 0;
            let ctx = self.ctx;
            // SAFETY: the context is open; the pointers are valid for the call.
            call(|err| unsafe { gb_launch_sync(ctx, iters, &mut t, err) })?;
            Ok(ns(t))
        }

        fn release_chain(&mut self) -> Result<()> {
            let ctx = self.ctx;
            // SAFETY: the context is open; the error record is valid for the call.
            call(|err| unsafe { gb_release_chain(ctx, err) })
        }

        fn build_instantiate(
            &mut self,
            mode: Mode,
            k: u32,
            shape: Shape,
            _checked: bool,
        ) -> Result<CycleRun> {
            let shape = GbShape::from(shape);
            let mut t = GbCycleTimes::default();
            let mode = c_mode(mode);
            let ctx = self.ctx;
            // SAFETY: the context is open; the pointers are valid for the call.
            call(|err| unsafe { gb_build_instantiate(ctx, mode, k, &shape, &mut t, err) })?;
            Ok(CycleRun {
                build: ns(t.build_ns),
                instantiate: ns(t.instantiate_ns),
            })
        }

        fn update_chain(&mut self, k: u32, shape: Shape) -> Result<()> {
            self.update = None;
            let elements = shape.elements as usize;
            let shape = GbShape::from(shape);
            let ctx = self.ctx;
            // SAFETY: the context is open; the pointers are valid for the call.
            call(|err| unsafe { gb_update_chain(ctx, k, &shape, err) })?;
            self.update = Some((k, vec![0; elements]));
            Ok(())
        }

        fn update_step(&mut self, step: u32) -> Result<UpdateRun> {
            let ctx = self.ctx;
            let Some((k, host)) = self.update.as_mut() else {
                return Err(BenchError(
                    "update_step: no kernel chain (call update_chain first)".into(),
                ));
            };
            let mut t = GbUpdateTimes::default();
            // SAFETY: the context is open; `host` holds the elements gb_update_chain was given,
            // as many as gb_update_step copies back; the other pointers are valid for the call.
            call(|err| unsafe { gb_update_step(ctx, step, host.as_mut_ptr(), &mut t, err) })?;
            verify_update(host, *k, step)?;
            Ok(UpdateRun {
                build: ns(t.build_ns),
                update: ns(t.update_ns),
                instantiate: ns(t.instantiate_ns),
            })
        }

        fn release_update(&mut self) -> Result<()> {
            self.update = None;
            let ctx = self.ctx;
            // SAFETY: the context is open; the error record is valid for the call.
            call(|err| unsafe { gb_release_update(ctx, err) })
        }

        fn stream_chain(&mut self, k: u32, shape: Shape, iters: u32) -> Result<StreamRun> {
            let shape = GbShape::from(shape);
            let mut t = GbStreamTimes::default();
            let ctx = self.ctx;
            // SAFETY: the context is open; the pointers are valid for the call.
            call(|err| unsafe { gb_stream_chain(ctx, k, &shape, iters, &mut t, err) })?;
            Ok(StreamRun {
                enqueue: ns(t.enqueue_ns),
                total: ns(t.total_ns),
            })
        }
    }
}

#[cfg(cuda_graph_bench_no_c)]
mod imp {
    use std::convert::Infallible;
    use std::time::Duration;

    use super::*;

    /// Stands in for the C baseline in builds without it: it cannot be made.
    #[derive(Debug)]
    pub struct CPath {
        never: Infallible,
    }

    impl CPath {
        /// Always fails: this build has no C baseline, and [`BUILD_NOTE`] says why.
        pub fn new(_ordinal: usize) -> Result<CPath> {
            Err(BenchError(format!(
                "this build has no C baseline: {BUILD_NOTE}; build with a CUDA toolkit (CUDA_PATH) to compare against C"
            )))
        }

        /// Unreachable: no value exists.
        pub fn runtime_version(&self) -> Result<i32> {
            match self.never {}
        }

        /// Unreachable: no value exists.
        pub fn address_reuse(&mut self, _bytes: usize) -> Result<(Vec<Mem>, bool)> {
            match self.never {}
        }

        /// Unreachable: no value exists.
        pub fn one_stream(&mut self, _shape: Shape, _spins: u64) -> Result<(Vec<Mem>, bool)> {
            match self.never {}
        }

        /// Unreachable: no value exists.
        pub fn concurrent(&mut self, _shape: Shape, _spins: u64) -> Result<Vec<Mem>> {
            match self.never {}
        }

        /// Unreachable: no value exists.
        pub fn unfreed(&mut self, _bytes: usize) -> Result<Vec<Mem>> {
            match self.never {}
        }

        /// Unreachable: no value exists.
        pub fn close(self) -> Result<()> {
            match self.never {}
        }
    }

    impl Workloads for CPath {
        fn id(&self) -> PathId {
            PathId::C
        }

        fn graph_chain(&mut self, _mode: Mode, _k: u32, _shape: Shape) -> Result<GraphRun> {
            match self.never {}
        }

        fn steady(&mut self, _launches: u32) -> Result<SteadyRun> {
            match self.never {}
        }

        fn launch_sync(&mut self, _iters: u32) -> Result<Duration> {
            match self.never {}
        }

        fn release_chain(&mut self) -> Result<()> {
            match self.never {}
        }

        fn build_instantiate(
            &mut self,
            _mode: Mode,
            _k: u32,
            _shape: Shape,
            _checked: bool,
        ) -> Result<CycleRun> {
            match self.never {}
        }

        fn stream_chain(&mut self, _k: u32, _shape: Shape, _iters: u32) -> Result<StreamRun> {
            match self.never {}
        }

        fn update_chain(&mut self, _k: u32, _shape: Shape) -> Result<()> {
            match self.never {}
        }

        fn update_step(&mut self, _step: u32) -> Result<UpdateRun> {
            match self.never {}
        }

        fn release_update(&mut self) -> Result<()> {
            match self.never {}
        }
    }
}

pub use imp::CPath;

#[cfg(all(test, not(cuda_graph_bench_no_c)))]
mod tests {
    #[test]
    fn c_structures_match() {
        super::imp::check_layout().unwrap();
    }
}
