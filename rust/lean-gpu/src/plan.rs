//! A recorded list of GPU commands: kernels append dispatches (pipeline, bind group, workgroup
//! count) with their bind groups and parameter buffers created once, at record time. A plan is
//! encoded into one compute pass (split only around buffer copies) and can be replayed for
//! every token: values that change per step (the position) live in a small uniform buffer the
//! caller rewrites before each submit, so nothing is created per token.
use crate::context::GpuContext;

enum Command {
    Dispatch {
        /// What the dispatch computes, e.g. "matvec Q4_0 896x4864" (for profiles).
        name: String,
        pipeline: wgpu::ComputePipeline,
        bind_group: wgpu::BindGroup,
        groups: (u32, u32),
    },
    Copy {
        src: wgpu::Buffer,
        src_offset: u64,
        dst: wgpu::Buffer,
        dst_offset: u64,
        size: u64,
    },
}

#[derive(Default)]
pub struct Plan {
    commands: Vec<Command>,
    // Uniform buffers of the dispatches, kept alive with the plan.
    _params: Vec<wgpu::Buffer>,
}

impl Plan {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.commands.len()
    }

    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    pub(crate) fn push_dispatch(
        &mut self,
        name: String,
        pipeline: &wgpu::ComputePipeline,
        bind_group: wgpu::BindGroup,
        params: wgpu::Buffer,
        groups: (u32, u32),
    ) {
        self.commands.push(Command::Dispatch {
            name,
            pipeline: pipeline.clone(),
            bind_group,
            groups,
        });
        self._params.push(params);
    }

    /// Copies `size` bytes between buffers (offsets and size multiples of 4).
    pub fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        size: u64,
    ) {
        self.commands.push(Command::Copy {
            src: src.clone(),
            src_offset,
            dst: dst.clone(),
            dst_offset,
            size,
        });
    }

    /// Records the plan into `encoder`: consecutive dispatches share one compute pass.
    pub fn encode(&self, encoder: &mut wgpu::CommandEncoder) {
        self.encode_with(encoder, None);
    }

    /// Timestamps `encode_profiled` writes: one before each dispatch and one after the last.
    pub fn timestamps(&self) -> u32 {
        self.dispatch_names().count() as u32 + 1
    }

    /// The dispatches' names, in order.
    pub fn dispatch_names(&self) -> impl Iterator<Item = &str> {
        self.commands.iter().filter_map(|c| match c {
            Command::Dispatch { name, .. } => Some(name.as_str()),
            Command::Copy { .. } => None,
        })
    }

    /// As `encode`, writing timestamp i into `set` before dispatch i and a last one after all
    /// of them (needs TIMESTAMP_QUERY_INSIDE_PASSES): dispatch i took from timestamp i to i + 1,
    /// its wait for the one before included.
    pub fn encode_profiled(&self, encoder: &mut wgpu::CommandEncoder, set: &wgpu::QuerySet) {
        self.encode_with(encoder, Some(set));
    }

    fn encode_with(&self, encoder: &mut wgpu::CommandEncoder, timestamps: Option<&wgpu::QuerySet>) {
        let mut i = 0;
        let mut dispatched = 0;
        while i < self.commands.len() {
            if let Command::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                size,
            } = &self.commands[i]
            {
                encoder.copy_buffer_to_buffer(src, *src_offset, dst, *dst_offset, *size);
                i += 1;
                continue;
            }
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("lean"),
                timestamp_writes: None,
            });
            while let Some(Command::Dispatch {
                pipeline,
                bind_group,
                groups,
                ..
            }) = self.commands.get(i)
            {
                if let Some(set) = timestamps {
                    pass.write_timestamp(set, dispatched);
                }
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, bind_group, &[]);
                pass.dispatch_workgroups(groups.0, groups.1, 1);
                dispatched += 1;
                i += 1;
            }
            if let (Some(set), true) = (timestamps, i == self.commands.len()) {
                pass.write_timestamp(set, dispatched);
            }
        }
        if let (Some(set), Some(Command::Copy { .. })) = (timestamps, self.commands.last()) {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.write_timestamp(set, dispatched);
        }
    }

    /// Encodes the plan into one command buffer and submits it.
    pub fn submit(&self, ctx: &GpuContext) {
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("lean plan"),
            });
        self.encode(&mut encoder);
        ctx.queue.submit([encoder.finish()]);
    }
}
