//! Slots: N engines, each with its own KV cache and its own OS thread (generation is blocking
//! and CPU-bound, so it stays off the async runtime). A request takes the free slot whose cache
//! holds the longest prefix of its prompt (the previous turn of its conversation, usually);
//! requests beyond the free slots wait in a bounded FIFO queue, and past it are refused.
use super::stop::StopStrings;
use lean::{Engine, FinishReason, GenerateOptions, Prompt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use tokio::sync::{mpsc::UnboundedSender, OwnedSemaphorePermit, Semaphore};

/// What a slot's thread sends back about one job.
pub enum SlotEvent {
    /// Final text (stop strings already cut out).
    Text(String),
    Done(Outcome),
    Failed(lean::LeanError),
}

pub struct Outcome {
    /// OpenAI's: "stop" (end of turn or a stop string) or "length" (max_tokens or a full context).
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Speculative decoding's guesses (zeros without it).
    pub speculation: lean::SpeculationStats,
}

impl Outcome {
    /// OpenAI's `usage` of this generation.
    pub fn usage(&self) -> super::openai::Usage {
        super::openai::Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            cached_tokens: self.cached_tokens,
            accepted_prediction_tokens: self.speculation.accepted,
            rejected_prediction_tokens: self.speculation.drafted - self.speculation.accepted,
        }
    }
}

pub struct Job {
    pub ids: Vec<u32>,
    pub options: GenerateOptions,
    /// The request's constraint, compiled when the request was checked (`options.constraint`
    /// stays `None`): the generation follows it as it is.
    pub constraint: Option<lean_constraint::Constraint>,
    pub stop: Vec<String>,
    /// Closed when the client went away: the generation stops at the next token.
    pub events: UnboundedSender<SlotEvent>,
}

pub struct Slots {
    engines: Vec<Arc<Mutex<Engine>>>,
    jobs: Vec<mpsc::Sender<(Job, Lease)>>,
    busy: Mutex<Vec<bool>>,
    /// One permit per free slot; tokio's semaphore queues its waiters in order.
    free: Arc<Semaphore>,
    queued: AtomicUsize,
    max_queued: usize,
    /// Each slot's backend (`Engine::backend`), kept current by the engines' backend-change
    /// hooks (a lost GPU device moves a slot to the CPU), readable while the slot generates.
    backends: Arc<Mutex<Vec<String>>>,
}

/// The queue is full: the request is refused (503).
pub struct QueueFull;

/// A slot held by one request, from its choice until its engine is done; dropping it frees the
/// slot.
pub struct Lease {
    slots: Arc<Slots>,
    index: usize,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The slot is marked free before the permit (a field) goes back, so whoever takes the
        // permit finds it.
        self.slots
            .busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[self.index] = false;
    }
}

impl Lease {
    /// Hands the job to the slot's thread, which frees the slot when the job is over.
    pub fn run(self, job: Job) {
        let jobs = self.slots.jobs[self.index].clone();
        if let Err(mpsc::SendError((job, _lease))) = jobs.send((job, self)) {
            let _ = job.events.send(SlotEvent::Failed(lean::LeanError::Backend(
                "the slot's thread has stopped".into(),
            )));
        }
    }
}

/// Counts a request as queued while it waits for a slot, including when its client goes away
/// (the waiting future is dropped).
struct Queued<'a>(&'a AtomicUsize);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Slots {
    /// Starts one thread per engine.
    pub fn start(engines: Vec<Engine>, max_queued: usize) -> Arc<Slots> {
        let backends = Arc::new(Mutex::new(
            engines.iter().map(Engine::backend).collect::<Vec<_>>(),
        ));
        let engines: Vec<_> = engines
            .into_iter()
            .enumerate()
            .map(|(index, mut engine)| {
                // A lost GPU device: the running request continues on the CPU, and so do the
                // slot's later ones (/health lists each slot's backend).
                let backends = backends.clone();
                engine.on_backend_change(Box::new(move |change| {
                    eprintln!(
                        "lean: slot {index}: the GPU device was lost ({}) after {} generated \
                         tokens; the request continues on {} (same tokens), and so do the \
                         slot's next ones",
                        change.reason, change.generated_tokens, change.to
                    );
                    backends.lock().unwrap_or_else(PoisonError::into_inner)[index] =
                        change.to.clone();
                }));
                Arc::new(Mutex::new(engine))
            })
            .collect();
        let mut jobs = Vec::new();
        for (index, engine) in engines.iter().enumerate() {
            let (sender, receiver) = mpsc::channel::<(Job, Lease)>();
            let engine = engine.clone();
            std::thread::Builder::new()
                .name(format!("lean-slot-{index}"))
                .spawn(move || {
                    for (job, lease) in receiver {
                        let mut engine = engine.lock().unwrap_or_else(PoisonError::into_inner);
                        run_job(&mut engine, job);
                        // The engine is unlocked before the slot is marked free.
                        drop(engine);
                        drop(lease);
                    }
                })
                .expect("spawning a slot thread");
            jobs.push(sender);
        }
        Arc::new(Slots {
            busy: Mutex::new(vec![false; engines.len()]),
            free: Arc::new(Semaphore::new(engines.len())),
            engines,
            jobs,
            queued: AtomicUsize::new(0),
            max_queued,
            backends,
        })
    }

    /// Each slot's backend, in one line each.
    pub fn backends(&self) -> Vec<String> {
        self.backends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn len(&self) -> usize {
        self.engines.len()
    }

    pub fn free_slots(&self) -> usize {
        self.free.available_permits()
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Waits for a free slot (in the queue, if there is room) and takes the one that can reuse
    /// the most of `ids` from its cache.
    pub async fn acquire(self: &Arc<Self>, ids: &[u32]) -> Result<Lease, QueueFull> {
        let permit = match self.free.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if self.queued.fetch_add(1, Ordering::SeqCst) >= self.max_queued {
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    return Err(QueueFull);
                }
                let _queued = Queued(&self.queued);
                self.free
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the slots' semaphore is never closed")
            }
        };
        let index = self.take_best_free(ids);
        Ok(Lease {
            slots: self.clone(),
            index,
            _permit: permit,
        })
    }

    /// Marks busy and returns the free slot with the longest reusable prefix of `ids` (the
    /// first on ties). A free slot's engine is idle, so its lock is not contended.
    fn take_best_free(&self, ids: &[u32]) -> usize {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        let prompt = Prompt::Ids(ids.to_vec());
        let reusable = |index: usize| {
            let engine = self.engines[index]
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            engine.reusable_tokens(&prompt).unwrap_or(0)
        };
        let best = (0..busy.len())
            .filter(|&i| !busy[i])
            .map(|i| (reusable(i), i))
            .max_by_key(|&(reused, i)| (reused, std::cmp::Reverse(i)))
            .map(|(_, i)| i)
            .expect("a permit holder always finds a free slot");
        busy[best] = true;
        best
    }
}

/// Runs one generation token by token, sending the text as it becomes final, until the end,
/// a stop string, or the client's departure.
fn run_job(engine: &mut Engine, job: Job) {
    let events = job.events.clone();
    let event = match generate(engine, job) {
        Ok(Some(outcome)) => SlotEvent::Done(outcome),
        Ok(None) => return, // The client went away: nobody to tell.
        Err(e) => SlotEvent::Failed(e),
    };
    let _ = events.send(event);
}

fn generate(engine: &mut Engine, mut job: Job) -> lean::Result<Option<Outcome>> {
    let send = |text: String| {
        if !text.is_empty() {
            let _ = job.events.send(SlotEvent::Text(text));
        }
    };
    let mut stops = StopStrings::new(job.stop.clone());
    let mut stopped_by_string = false;
    let prompt = Prompt::Ids(std::mem::take(&mut job.ids));
    let mut active = match job.constraint.take() {
        Some(constraint) => engine.begin_constrained(&prompt, &job.options, constraint)?,
        None => engine.begin(&prompt, &job.options)?,
    };
    loop {
        if job.events.is_closed() {
            break;
        }
        let step = engine.step(&mut active)?;
        if let Some(token) = step.token {
            let (text, stopped) = stops.push(&token.text);
            send(text);
            if stopped {
                stopped_by_string = true;
                break;
            }
        }
        if step.finished.is_some() {
            break;
        }
    }
    let ended = engine.finish(active)?;
    if !stopped_by_string {
        if let Some(held_back) = ended.held_back {
            let (text, stopped) = stops.push(&held_back.text);
            send(text);
            stopped_by_string = stopped;
        }
        send(stops.finish());
    }
    let generation = ended.generation;
    let finish_reason = match (stopped_by_string, generation.finish_reason) {
        (true, _) | (false, FinishReason::Stop) => "stop",
        (false, FinishReason::Length | FinishReason::ContextFull) => "length",
        (false, FinishReason::Cancelled) => return Ok(None),
    };
    Ok(Some(Outcome {
        finish_reason,
        prompt_tokens: generation.prompt_ids.len(),
        cached_tokens: generation.timings.cached_tokens,
        completion_tokens: generation.token_ids.len(),
        speculation: generation.timings.speculation,
    }))
}
