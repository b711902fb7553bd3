//! Typed errors of the GPU backend: every failure (no adapter, a missing feature, a shape that
//! does not fit) is reported, never a panic.
use lean_gguf::TensorType;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuError {
    /// No adapter (GPU or software rasterizer) could be found: the reason wgpu gave.
    NoAdapter(String),
    /// The adapter lacks features the caller required (their names).
    MissingFeatures(String),
    /// The adapter was found but refused to create a device.
    RequestDevice(String),
    /// There is no kernel for this tensor type.
    UnsupportedType(TensorType),
    /// Sizes of the arguments do not agree (a caller bug or a malformed tensor).
    Shape(String),
    /// A tensor cannot be split to fit the device's buffer limits (e.g. one row is too large).
    TooLarge(String),
    /// The device rejected a kernel (its message).
    Shader(String),
    /// Reading a buffer back to the host failed.
    Readback(String),
    /// The device reported an error (out of memory, validation).
    Device(String),
    /// The device was lost (driver reset, a browser reclaiming it, an out-of-memory the driver
    /// could not survive, `GpuContext::lose_device`): nothing on it can run any more.
    DeviceLost(String),
    /// A model streamed into the device is malformed or incomplete.
    Load(String),
}

impl std::fmt::Display for GpuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuError::NoAdapter(why) => write!(f, "no GPU adapter available: {why}"),
            GpuError::MissingFeatures(names) => {
                write!(f, "the GPU adapter lacks required features: {names}")
            }
            GpuError::RequestDevice(why) => {
                write!(f, "the GPU adapter could not create a device: {why}")
            }
            GpuError::UnsupportedType(ty) => {
                write!(f, "the GPU backend has no kernel for {ty} tensors")
            }
            GpuError::Shape(why) => write!(f, "GPU kernel arguments do not fit: {why}"),
            GpuError::TooLarge(why) => write!(f, "tensor too large for the GPU's limits: {why}"),
            GpuError::Shader(why) => write!(f, "a GPU kernel failed to compile: {why}"),
            GpuError::Readback(why) => write!(f, "reading a GPU buffer back failed: {why}"),
            GpuError::Device(why) => write!(f, "the GPU device failed: {why}"),
            GpuError::DeviceLost(why) => write!(f, "the GPU device was lost: {why}"),
            GpuError::Load(why) => write!(f, "loading the model onto the GPU failed: {why}"),
        }
    }
}

impl std::error::Error for GpuError {}

pub type Result<T> = std::result::Result<T, GpuError>;
