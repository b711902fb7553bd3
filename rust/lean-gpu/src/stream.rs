//! Loading a model straight into GPU buffers as its file streams in (a browser's `fetch`), so
//! that the host never holds the whole file: only its header, the small 1-D tensors (norms,
//! biases) and the one weight matrix being received, which goes to the device as soon as its
//! last byte arrives; or, for matrices that go to the device stacked (stack.rs: a layer's q, k,
//! v or gate, up), the members received so far, until the last one arrives (the file holds a
//! layer's tensors together, in no particular order: llama.cpp writes attn_k before attn_q).
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::kernels::{matvec_supports, Kernels};
use crate::session::GpuSession;
use crate::stack;
use crate::weights::GpuMatrix;
use lean::gguf::{Gguf, GgufError};
use lean::{Model, ModelBytes, PartialBytes};
use std::collections::HashMap;
use std::sync::Arc;

/// A tensor of the file, in file order.
struct Tensor {
    name: String,
    offset: usize,
    size: usize,
    /// A weight matrix for the device (2-D); else kept on the host.
    matrix: Option<(lean::gguf::TensorType, usize, usize)>,
    /// (index in `Layout::stacks`, member index) of a matrix that goes to the device stacked.
    stack: Option<(usize, usize)>,
}

/// Matrices that go to the device as one, stacked by rows.
struct Stack {
    /// Their indices in `Layout::tensors`, in stacking order.
    members: Vec<usize>,
    /// The bytes of the members received so far.
    held: Vec<Option<Vec<u8>>>,
}

/// What the header told: the tensors still to receive.
struct Layout {
    tensors: Vec<Tensor>,
    stacks: Vec<Stack>,
    /// Index of the tensor that the next bytes belong to (or precede, in padding).
    next: usize,
    /// The bytes received of tensor `next`.
    current: Vec<u8>,
}

/// A GGUF file pushed chunk by chunk (any sizes), its weight matrices uploaded one by one.
pub struct StreamedModel {
    ctx: Arc<GpuContext>,
    file_len: usize,
    max_part_bytes: u64,
    received: usize,
    /// The file's first bytes until the header parses, then exactly the header.
    header: Vec<u8>,
    layout: Option<Layout>,
    /// Uploaded matrices by the file offsets of their members (one unless stacked).
    matrices: HashMap<Vec<usize>, GpuMatrix>,
    /// The 1-D tensors: (file offset, bytes).
    kept: Vec<(usize, Vec<u8>)>,
}

impl StreamedModel {
    /// Expects a file of `file_len` bytes; matrices are split into parts of at most
    /// `max_part_bytes` (default: the device's binding limit).
    pub fn new(ctx: Arc<GpuContext>, file_len: usize, max_part_bytes: Option<u64>) -> Self {
        let max_part_bytes = max_part_bytes.unwrap_or_else(|| ctx.max_binding_bytes());
        StreamedModel {
            ctx,
            file_len,
            max_part_bytes,
            received: 0,
            header: Vec::new(),
            layout: None,
            matrices: HashMap::new(),
            kept: Vec::new(),
        }
    }

    pub fn received(&self) -> usize {
        self.received
    }

    /// Takes the next bytes of the file. Fails on more bytes than announced, a malformed
    /// header, a tensor type without GPU kernels, or a device error during an upload.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        if chunk.len() > self.file_len - self.received {
            return Err(GpuError::Load(format!(
                "the model data is longer than the announced {} bytes (received {} + {})",
                self.file_len,
                self.received,
                chunk.len()
            )));
        }
        let start = self.received;
        self.received += chunk.len();
        if self.layout.is_some() {
            return self.route(start, chunk);
        }
        self.header.extend_from_slice(chunk);
        let gguf = match Gguf::parse_header(&self.header, self.file_len as u64) {
            Ok(gguf) => gguf,
            // Wait for more of the header (the file length bounds how long it can be).
            Err(GgufError::NeedMoreBytes { .. }) if self.received < self.file_len => return Ok(()),
            Err(e) => return Err(GpuError::Load(format!("invalid GGUF file: {e}"))),
        };
        let layout = self.plan(&gguf)?;
        self.layout = Some(layout);
        // Bytes past the header already belong to tensors.
        let past = self
            .header
            .split_off(gguf.data_offset.min(self.header.len()));
        self.route(gguf.data_offset, &past)
    }

    /// The tensors in file order, each checked for the GPU before any upload.
    fn plan(&self, gguf: &Gguf) -> Result<Layout> {
        let mut tensors = Vec::with_capacity(gguf.tensors.len());
        for t in &gguf.tensors {
            let matrix = (t.dims.len() == 2).then(|| (t.ty, t.rows(), t.row_len()));
            if matrix.is_some() && !matvec_supports(t.ty) {
                return Err(GpuError::Shape(format!(
                    "tensor '{}': {}",
                    t.name,
                    GpuError::UnsupportedType(t.ty)
                )));
            }
            tensors.push(Tensor {
                name: t.name.clone(),
                offset: t.offset,
                size: t.size,
                matrix,
                stack: None,
            });
        }
        tensors.sort_by_key(|t| t.offset);
        let stacks = Self::find_stacks(&mut tensors);
        if let Some(pair) = tensors
            .windows(2)
            .find(|w| w[0].offset + w[0].size > w[1].offset)
        {
            return Err(GpuError::Load(format!(
                "tensors '{}' and '{}' overlap in the file",
                pair[0].name, pair[1].name
            )));
        }
        Ok(Layout {
            tensors,
            stacks,
            next: 0,
            current: Vec::new(),
        })
    }

    /// The stacks of 2-D tensors that stack.rs makes of each layer's stack whose members are all
    /// in the file (the same runs as `GpuSession::load_with`'s); marks their members.
    fn find_stacks(tensors: &mut [Tensor]) -> Vec<Stack> {
        let mut found: HashMap<(usize, usize), Vec<Option<usize>>> = HashMap::new();
        for (i, t) in tensors.iter().enumerate() {
            if let Some((layer, stack, member)) = stack::member_of(&t.name) {
                let members = found
                    .entry((layer, stack))
                    .or_insert_with(|| vec![None; stack::LAYER_STACKS[stack].len()]);
                members[member] = Some(i);
            }
        }
        let mut keys: Vec<_> = found.keys().copied().collect();
        keys.sort_unstable();
        let mut stacks = Vec::new();
        for key in keys {
            let Some(members) = found[&key].iter().copied().collect::<Option<Vec<usize>>>() else {
                continue;
            };
            let Some(shapes) = members
                .iter()
                .map(|&i| tensors[i].matrix.map(|(ty, _, cols)| (ty, cols)))
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            for run in stack::runs(&shapes).into_iter().filter(|run| run.len() > 1) {
                let members = members[run].to_vec();
                for (member, &i) in members.iter().enumerate() {
                    tensors[i].stack = Some((stacks.len(), member));
                }
                stacks.push(Stack {
                    held: vec![None; members.len()],
                    members,
                });
            }
        }
        stacks
    }

    /// Hands `bytes` (file offset `pos`) to the tensors they belong to.
    fn route(&mut self, mut pos: usize, mut bytes: &[u8]) -> Result<()> {
        let layout = self
            .layout
            .as_mut()
            .expect("routing starts after the header");
        while !bytes.is_empty() {
            let Some(t) = layout.tensors.get(layout.next) else {
                return Ok(()); // padding after the last tensor
            };
            if pos < t.offset {
                // Alignment padding before the tensor.
                let skip = (t.offset - pos).min(bytes.len());
                pos += skip;
                bytes = &bytes[skip..];
                continue;
            }
            if layout.current.capacity() < t.size {
                layout.current.try_reserve_exact(t.size).map_err(|_| {
                    GpuError::Load(format!(
                        "cannot allocate {} bytes of host memory to receive tensor '{}'",
                        t.size, t.name
                    ))
                })?;
            }
            let take = (t.size - layout.current.len()).min(bytes.len());
            layout.current.extend_from_slice(&bytes[..take]);
            pos += take;
            bytes = &bytes[take..];
            if layout.current.len() < t.size {
                continue;
            }
            let data = std::mem::take(&mut layout.current);
            layout.next += 1;
            let Some((ty, rows, cols)) = t.matrix else {
                self.kept.push((t.offset, data));
                continue;
            };
            // A matrix alone, or the stack it completes.
            let (key, rows, data) = match t.stack {
                None => (vec![t.offset], rows, data),
                Some((s, member)) => {
                    let stack = &mut layout.stacks[s];
                    stack.held[member] = Some(data);
                    if stack.held.iter().any(Option::is_none) {
                        continue;
                    }
                    let held: Vec<Vec<u8>> = stack.held.iter_mut().flat_map(Option::take).collect();
                    let members: Vec<&Tensor> =
                        stack.members.iter().map(|&i| &layout.tensors[i]).collect();
                    let parts: Vec<&[u8]> = held.iter().map(Vec::as_slice).collect();
                    let names: Vec<&str> = members.iter().map(|m| &m.name[..]).collect();
                    let interleave =
                        stack::interleaves(&names).then(|| parts[0].len() / rows.max(1));
                    (
                        members.iter().map(|m| m.offset).collect(),
                        members
                            .iter()
                            .filter_map(|m| m.matrix)
                            .map(|(_, rows, _)| rows)
                            .sum(),
                        stack::stacked_bytes(&parts, interleave),
                    )
                }
            };
            let m = GpuMatrix::upload_split(&self.ctx, ty, rows, cols, &data, self.max_part_bytes)
                .map_err(|e| GpuError::Shape(format!("tensor '{}': {e}", t.name)))?;
            self.ctx.take_error()?;
            self.matrices.insert(key, m);
        }
        Ok(())
    }

    /// Once every byte arrived: the model (its matrices on the device) and a session over them
    /// with a KV cache of `context_length` positions (capped at the model's).
    pub async fn into_session(
        self,
        kernels: Arc<Kernels>,
        context_length: usize,
    ) -> Result<(Model, GpuSession)> {
        if self.received != self.file_len {
            return Err(GpuError::Load(format!(
                "the model data ended after {} of {} bytes (an interrupted download?)",
                self.received, self.file_len
            )));
        }
        let model = Model::load(ModelBytes::Partial(PartialBytes {
            file_len: self.file_len,
            header: self.header,
            tensors: self.kept,
        }))
        .map_err(|e| GpuError::Load(e.to_string()))?;
        let context_length = lean::Engine::capped_context(&model, context_length)
            .map_err(|e| GpuError::Load(e.to_string()))?;
        let mut matrices = self.matrices;
        let session = GpuSession::load_with(self.ctx, kernels, &model, context_length, |members| {
            let key: Vec<usize> = members.iter().map(|m| m.offset).collect();
            matrices.remove(&key).ok_or_else(|| {
                let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
                GpuError::Load(format!(
                    "tensor(s) {names:?} were not uploaded as one matrix"
                ))
            })
        })
        .await?;
        Ok((model, session))
    }
}
