//! A recorded list of GPU commands: kernels append dispatches (pipeline, bind group, workgroup
//! count) with their bind groups and parameter buffers created once, at record time. A plan is
//! encoded into one compute pass (split only around buffer copies) and can be replayed for
//! every token: values that change per step (the position) live in a small uniform buffer the
//! caller rewrites before each submit, so nothing is created per token.
use crate::context::GpuContext;

enum Command {
    Dispatch {
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
        pipeline: &wgpu::ComputePipeline,
        bind_group: wgpu::BindGroup,
        params: wgpu::Buffer,
        groups: (u32, u32),
    ) {
        self.commands.push(Command::Dispatch {
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
        let mut i = 0;
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
            }) = self.commands.get(i)
            {
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, bind_group, &[]);
                pass.dispatch_workgroups(groups.0, groups.1, 1);
                i += 1;
            }
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
