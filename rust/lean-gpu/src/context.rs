//! The device: adapter selection, limits, buffers and non-blocking readback.
use crate::error::{GpuError, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use wgpu::util::DeviceExt;

/// A wgpu device and queue with what the kernels need to know about them.
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    features: wgpu::Features,
    /// The first error the device reported outside an error scope (validation, out of
    /// memory) or its loss: wgpu would panic on those by default; here they are kept and
    /// returned by `take_error`.
    failure: Arc<Mutex<Option<String>>>,
    /// Set when the device is lost (its lost callback ran): for good, unlike `failure`.
    lost: Arc<Mutex<Option<String>>>,
    /// The test hook: passes still to submit before the device is destroyed (`usize::MAX`: never).
    lose_after: AtomicUsize,
}

/// `lose_after` when no loss is planned.
const NEVER: usize = usize::MAX;

/// Features used when present; kernels have fallbacks without them.
const OPTIONAL_FEATURES: wgpu::Features =
    wgpu::Features::SHADER_F16.union(wgpu::Features::SUBGROUP);

impl GpuContext {
    /// The high-performance adapter of every backend compiled in, with its full limits.
    pub async fn new() -> Result<Self> {
        Self::with_features(wgpu::Features::empty()).await
    }

    /// As `new`, failing with `MissingFeatures` unless the adapter has all of `required`.
    pub async fn with_features(required: wgpu::Features) -> Result<Self> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let options = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        };
        let adapter = instance
            .request_adapter(&options)
            .await
            .map_err(|e| GpuError::NoAdapter(e.to_string()))?;
        Self::from_adapter(&adapter, required).await
    }

    /// Opens a device on `adapter` with the adapter's own limits (the defaults would cap buffer
    /// bindings at 128 MiB, too small for an output matrix).
    pub async fn from_adapter(adapter: &wgpu::Adapter, required: wgpu::Features) -> Result<Self> {
        let available = adapter.features();
        let missing = required - available;
        if !missing.is_empty() {
            return Err(GpuError::MissingFeatures(format!("{missing:?}")));
        }
        let mut optional = OPTIONAL_FEATURES;
        if crate::profile::requested() {
            optional |= crate::profile::FEATURES;
        }
        let features = required | (available & optional);
        let limits = adapter.limits();
        let descriptor = wgpu::DeviceDescriptor {
            label: Some("lean"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = adapter
            .request_device(&descriptor)
            .await
            .map_err(|e| GpuError::RequestDevice(e.to_string()))?;
        let failure: Arc<Mutex<Option<String>>> = Arc::default();
        let record = |failure: &Arc<Mutex<Option<String>>>, message: String| {
            let mut slot = failure.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(message);
        };
        let on_error = failure.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            record(&on_error, e.to_string())
        }));
        let lost: Arc<Mutex<Option<String>>> = Arc::default();
        let on_lost = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            let message = message.trim();
            let why = match message.is_empty() {
                true => format!("{reason:?}"),
                false => format!("{reason:?}: {message}"),
            };
            record(&on_lost, why)
        });
        // The test hook: LEAN_GPU_LOSE_DEVICE_AFTER=N destroys the device before the pass after
        // the first N (natively; a browser has no environment: `lose_device_after`).
        let lose_after = match std::env::var("LEAN_GPU_LOSE_DEVICE_AFTER") {
            Ok(n) if !cfg!(target_arch = "wasm32") => n.trim().parse().map_err(|_| {
                GpuError::RequestDevice(format!(
                    "LEAN_GPU_LOSE_DEVICE_AFTER must be a number of passes, got {n:?}"
                ))
            })?,
            _ => NEVER,
        };
        Ok(GpuContext {
            device,
            queue,
            info: adapter.get_info(),
            limits,
            features,
            failure,
            lost,
            lose_after: AtomicUsize::new(lose_after),
        })
    }

    /// The first error the device reported since the last call (out of memory, validation), as
    /// `GpuError::Device`; once the device is lost, always `GpuError::DeviceLost`.
    pub fn take_error(&self) -> Result<()> {
        // No poll here: this runs after every pass (a failure after a loss that the callback has
        // not reported yet is classified as the loss by `classify`, which polls).
        if let Some(why) = self.lost_already() {
            return Err(GpuError::DeviceLost(why));
        }
        let mut slot = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        match slot.take() {
            Some(message) => Err(GpuError::Device(message)),
            None => Ok(()),
        }
    }

    /// Why the device was lost, once it was (its lost callback ran). Natively the callback runs
    /// inside a device poll: this polls first, without waiting.
    pub fn lost_reason(&self) -> Option<String> {
        if !cfg!(target_arch = "wasm32") {
            let _ = self.device.poll(wgpu::PollType::Poll);
        }
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `lost_reason` without the poll: for the per-pass path, where a poll costs time.
    pub(crate) fn lost_already(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `e` as it should be reported: a failure of a lost device is the loss (reads back and
    /// submits fail in many ways once it is gone), anything else as it is.
    pub fn classify(&self, e: GpuError) -> GpuError {
        match e {
            GpuError::DeviceLost(_) => e,
            // The loss says it all: what failed on the way is its consequence.
            e => match self.lost_reason() {
                Some(why) => GpuError::DeviceLost(why),
                None => e,
            },
        }
    }

    /// Test hook: destroys the device (`wgpu::Device::destroy`), as a driver reset or a browser
    /// reclaiming it would lose it. Every later pass fails with `GpuError::DeviceLost`.
    pub fn lose_device(&self) {
        self.lose_after.store(NEVER, Ordering::Relaxed);
        self.device.destroy();
        // A browser resolves `GPUDevice.lost` on its event loop, maybe after the pass that is
        // about to fail: the loss is recorded now. (Natively the lost callback records it,
        // inside the next poll.)
        if cfg!(target_arch = "wasm32") {
            let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
            lost.get_or_insert_with(|| "Destroyed".into());
        }
    }

    /// Test hook: destroys the device before the pass (a prefill chunk or one decode pass) after
    /// the next `passes` ones; 0: before the next. Natively `LEAN_GPU_LOSE_DEVICE_AFTER=N` sets
    /// it when the context is made.
    pub fn lose_device_after(&self, passes: usize) {
        self.lose_after.store(passes, Ordering::Relaxed);
    }

    /// Called before each pass is submitted: runs the `lose_device_after` hook.
    pub(crate) fn before_pass(&self) {
        let left = self.lose_after.load(Ordering::Relaxed);
        if left == NEVER {
            return;
        }
        if left == 0 {
            self.lose_device();
        } else {
            self.lose_after.store(left - 1, Ordering::Relaxed);
        }
    }

    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// One line for logs: adapter name, backend, driver (a browser reveals little of them).
    pub fn describe(&self) -> String {
        let i = &self.info;
        let name = if i.name.is_empty() {
            "unnamed adapter"
        } else {
            &i.name
        };
        let driver = format!("{} {}", i.driver, i.driver_info);
        let driver = driver.trim();
        if driver.is_empty() {
            format!("{name} ({:?}, {:?})", i.backend, i.device_type)
        } else {
            format!(
                "{name} ({:?}, {:?}, driver {driver})",
                i.backend, i.device_type
            )
        }
    }

    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    pub fn features(&self) -> wgpu::Features {
        self.features
    }

    /// Largest byte size one storage binding (hence one weight part) may have.
    pub fn max_binding_bytes(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// A storage buffer holding `data`, padded with zero bytes to a multiple of 4 (WGSL reads
    /// whole u32 words).
    pub fn upload_bytes(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut padded;
        let contents = if data.len().is_multiple_of(4) && !data.is_empty() {
            data
        } else {
            padded = data.to_vec();
            padded.resize(data.len().next_multiple_of(4).max(4), 0);
            &padded
        };
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
            })
    }

    pub fn upload_f32(&self, label: &str, data: &[f32]) -> wgpu::Buffer {
        self.upload_bytes(label, bytemuck::cast_slice(data))
    }

    /// A zeroed storage buffer of `len` f32 (at least one, as empty bindings are invalid).
    pub fn storage_f32(&self, label: &str, len: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (len.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// A uniform buffer holding `value`. Made empty and written through the queue rather than
    /// mapped at creation: on a lost device wgpu's mapped-at-creation path panics, this one
    /// records an error (plans are recorded mid-generation, when a device may be gone).
    pub(crate) fn uniform<T: bytemuck::Pod>(&self, label: &str, value: &T) -> wgpu::Buffer {
        let bytes = bytemuck::bytes_of(value);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (bytes.len().next_multiple_of(4).max(4)) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue.write_buffer(&buffer, 0, bytes);
        buffer
    }

    /// Copies the first `len` f32 of `buffer` to the host (after all submitted work).
    pub fn read_f32(
        &self,
        buffer: &wgpu::Buffer,
        len: usize,
    ) -> impl Future<Output = Result<Vec<f32>>> + '_ {
        let bytes = self.read_bytes(buffer, len * 4);
        async move { Ok(bytemuck::cast_slice(&bytes.await?).to_vec()) }
    }

    pub fn read_u32(
        &self,
        buffer: &wgpu::Buffer,
        len: usize,
    ) -> impl Future<Output = Result<Vec<u32>>> + '_ {
        let bytes = self.read_bytes(buffer, len * 4);
        async move { Ok(bytemuck::cast_slice(&bytes.await?).to_vec()) }
    }

    /// Copies `len` bytes (a multiple of 4) into a staging buffer and maps it. The copy and the
    /// map request are issued now; the future never blocks: natively it polls the device without
    /// waiting (an executor that wants to sleep meanwhile calls `device.poll(Wait)` itself), in a
    /// browser the map callback comes from the event loop.
    pub fn read_bytes(
        &self,
        buffer: &wgpu::Buffer,
        len: usize,
    ) -> impl Future<Output = Result<Vec<u8>>> + '_ {
        let checked = if !len.is_multiple_of(4) || len as u64 > buffer.size() {
            Err(GpuError::Readback(format!(
                "cannot read {len} bytes from a buffer of {}",
                buffer.size()
            )))
        } else {
            Ok(())
        };
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: len.max(4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut request = None;
        if checked.is_ok() && len > 0 {
            let mut encoder = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("readback"),
                });
            encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, len as u64);
            self.queue.submit([encoder.finish()]);
            request = Some(self.request_map(&staging));
        }
        async move {
            checked?;
            let Some(request) = request else {
                return Ok(Vec::new());
            };
            let bytes = self.read_mapped(&request, &staging, len).await?;
            Ok(bytes)
        }
    }

    /// Asks to map `buffer` (MAP_READ) for reading once the work submitted so far is done; the
    /// result is awaited later with `read_mapped`. Issuing the map right after a submit lets a
    /// browser resolve it with that submit, not with later ones.
    pub(crate) fn request_map(&self, buffer: &wgpu::Buffer) -> MapRequest {
        let state = Arc::new(Mutex::new(MapState::default()));
        let callback_state = state.clone();
        buffer.map_async(wgpu::MapMode::Read, .., move |result| {
            let mut s = callback_state.lock().unwrap_or_else(|e| e.into_inner());
            s.result = Some(result.map_err(|e| e.to_string()));
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
        MapRequest { state }
    }

    /// Awaits the map of `request` (made for `buffer`) and copies out its first `len` bytes,
    /// then unmaps the buffer.
    pub(crate) async fn read_mapped(
        &self,
        request: &MapRequest,
        buffer: &wgpu::Buffer,
        len: usize,
    ) -> Result<Vec<u8>> {
        MapFuture {
            device: &self.device,
            state: request.state.clone(),
        }
        .await
        .map_err(GpuError::Readback)?;
        let bytes = buffer
            .slice(..len as u64)
            .get_mapped_range()
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .to_vec();
        buffer.unmap();
        Ok(bytes)
    }
}

/// A buffer map in flight (`GpuContext::request_map`).
pub(crate) struct MapRequest {
    state: Arc<Mutex<MapState>>,
}

#[derive(Default)]
struct MapState {
    result: Option<std::result::Result<(), String>>,
    waker: Option<Waker>,
}

struct MapFuture<'a> {
    device: &'a wgpu::Device,
    state: Arc<Mutex<MapState>>,
}

impl Future for MapFuture<'_> {
    type Output = std::result::Result<(), String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Natively, callbacks only run inside device.poll; Poll never blocks.
        if let Err(e) = self.device.poll(wgpu::PollType::Poll) {
            return Poll::Ready(Err(e.to_string()));
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(result) = s.result.take() {
            return Poll::Ready(result);
        }
        s.waker = Some(cx.waker().clone());
        // Natively nothing else would wake us: ask to be polled again (a browser wakes us from
        // the map callback instead).
        if !cfg!(target_arch = "wasm32") {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}
