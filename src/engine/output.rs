//! An attempt's whole output, kept in the database as the job prints it:
//! its head and its tail within the job's `output_max`, in chunks any
//! replica reads. The job never waits for the database: its pieces queue
//! within [`QUEUE_BOUND`] bytes, and what does not fit is counted as lost
//! and shown as such where it was left out.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::state::Stream;
use crate::store::{Chunk, Store};

/// The most bytes of output waiting to be written; past it, pieces are
/// counted as lost rather than held.
pub const QUEUE_BOUND: i64 = 4 * 1024 * 1024;

/// The longest a chunk grows.
const CHUNK: usize = 64 * 1024;

/// How often what was printed meanwhile is written.
const FLUSH_EVERY: Duration = Duration::from_millis(250);

/// How long the end of an attempt waits for its output to be written.
const FINISH_WAIT: Duration = Duration::from_secs(5);

/// Where an attempt's output goes: handed to each stream's reader.
#[derive(Clone)]
pub struct Pen {
    pieces: mpsc::UnboundedSender<(Stream, String)>,
    /// Bytes sent and not yet taken by the writer.
    queued: Arc<AtomicI64>,
    /// Bytes left out since the writer last looked.
    lost: Arc<AtomicI64>,
}

impl Pen {
    /// Adds `text` (secrets masked) to the output; never waits. A NUL
    /// byte is kept as U+FFFD, as bytes that are no UTF-8 are: PostgreSQL's
    /// `text` refuses it, and both databases keep the same output.
    pub fn write(&self, stream: Stream, text: &str) {
        let text = match text.contains('\0') {
            true => text.replace('\0', "\u{FFFD}"),
            false => text.to_owned(),
        };
        let n = text.len() as i64;
        if self.queued.fetch_add(n, Ordering::AcqRel) + n > QUEUE_BOUND
            || self.pieces.send((stream, text)).is_err()
        {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            self.lost.fetch_add(n, Ordering::AcqRel);
        }
    }
}

/// An attempt's output being written.
pub struct Recorder {
    pen: Pen,
    writer: tokio::task::JoinHandle<()>,
}

/// Which attempt, and how much of its output is kept.
pub struct Attempt {
    pub store: Store,
    pub key: String,
    pub attempt: i32,
    pub job: String,
    pub output_max: u64,
}

impl Recorder {
    /// Starts writing the output of `attempt`.
    pub fn start(attempt: Attempt) -> Recorder {
        let (pieces, received) = mpsc::unbounded_channel();
        let pen = Pen {
            pieces,
            queued: Arc::default(),
            lost: Arc::default(),
        };
        let writer = tokio::spawn(write(
            attempt,
            received,
            pen.queued.clone(),
            pen.lost.clone(),
        ));
        Recorder { pen, writer }
    }

    /// A pen for one of the job's streams.
    pub fn pen(&self) -> Pen {
        self.pen.clone()
    }

    /// Waits, a few seconds at most, for what was printed to be written,
    /// once every pen is dropped.
    pub async fn finish(self) {
        drop(self.pen);
        let mut writer = self.writer;
        if tokio::time::timeout(FINISH_WAIT, &mut writer)
            .await
            .is_err()
        {
            writer.abort();
            tracing::warn!("the job's output was not all written within {FINISH_WAIT:?}");
        }
    }
}

/// The writer: takes the pieces as they come, keeps the head and the tail
/// and writes what is new every [`FLUSH_EVERY`].
async fn write(
    attempt: Attempt,
    mut received: mpsc::UnboundedReceiver<(Stream, String)>,
    queued: Arc<AtomicI64>,
    lost: Arc<AtomicI64>,
) {
    let mut kept = Kept::new(attempt.output_max);
    let mut open = true;
    while open {
        // Wait for a piece, then gather for a flush interval.
        match received.recv().await {
            Some(piece) => take(&mut kept, piece, &queued, &lost),
            None => open = false,
        }
        let due = tokio::time::Instant::now() + FLUSH_EVERY;
        while open {
            match tokio::time::timeout_at(due, received.recv()).await {
                Ok(Some(piece)) => take(&mut kept, piece, &queued, &lost),
                Ok(None) => open = false,
                Err(_) => break,
            }
        }
        kept.note_lost(lost.swap(0, Ordering::AcqRel));
        flush(&attempt, &mut kept).await;
    }
}

fn take(kept: &mut Kept, (stream, text): (Stream, String), queued: &AtomicI64, lost: &AtomicI64) {
    queued.fetch_sub(text.len() as i64, Ordering::AcqRel);
    kept.note_lost(lost.swap(0, Ordering::AcqRel));
    kept.add(stream, &text);
}

/// Writes the new chunks and drops the written ones the tail has let go;
/// a chunk that could not be written is counted as lost.
async fn flush(attempt: &Attempt, kept: &mut Kept) {
    let (new, gone) = kept.take_new();
    let store = &attempt.store;
    if let Err(e) = store
        .write_output(&attempt.key, attempt.attempt, &attempt.job, &new)
        .await
    {
        tracing::warn!(
            period_key = attempt.key,
            "the job's output could not be written: {e}"
        );
        kept.unwritten(&new);
    }
    if let Some((first, last)) = gone
        && let Err(e) = store
            .drop_output(&attempt.key, attempt.attempt, first, last)
            .await
    {
        tracing::warn!(
            period_key = attempt.key,
            "the job's older output could not be dropped: {e}"
        );
    }
}

/// What is kept of an attempt's output, and what is not written yet.
struct Kept {
    head_max: i64,
    tail_max: i64,
    /// Where the next byte goes in all the attempt printed.
    at_byte: i64,
    /// Lost bytes not yet placed before a chunk.
    lost: i64,
    next_seq: i32,
    /// The tail's chunks (seq, length), oldest first, written or not.
    tail: VecDeque<(i32, i64)>,
    tail_bytes: i64,
    /// Chunks not written yet, oldest first.
    new: Vec<Chunk>,
    /// The written chunks the tail has let go: a range of seq.
    gone: Option<(i32, i32)>,
}

impl Kept {
    fn new(output_max: u64) -> Kept {
        let max = i64::try_from(output_max).unwrap_or(i64::MAX);
        Kept {
            head_max: max / 2,
            tail_max: max - max / 2,
            at_byte: 0,
            lost: 0,
            next_seq: 0,
            tail: VecDeque::new(),
            tail_bytes: 0,
            new: Vec::new(),
            gone: None,
        }
    }

    fn note_lost(&mut self, n: i64) {
        self.lost += n;
        self.at_byte += n;
    }

    /// Adds `text`: to the head while it has room, to the tail after.
    fn add(&mut self, stream: Stream, mut text: &str) {
        if self.at_byte < self.head_max {
            let room = usize::try_from(self.head_max - self.at_byte).unwrap_or(usize::MAX);
            let cut = floor_char_boundary(text, room.min(text.len()));
            if cut > 0 {
                self.append(stream, &text[..cut], false);
            }
            text = &text[cut..];
        }
        if !text.is_empty() {
            self.append(stream, text, true);
            self.trim_tail();
        }
    }

    /// Appends `text` to the newest unwritten chunk when it is of the same
    /// stream and part, with nothing lost between and room left; starts a
    /// new chunk otherwise.
    fn append(&mut self, stream: Stream, text: &str, in_tail: bool) {
        let joins = self.lost == 0
            && self.new.last().is_some_and(|c| {
                c.stream == stream
                    && c.end() == self.at_byte
                    && c.text.len() + text.len() <= CHUNK
                    && (c.at_byte >= self.head_max) == in_tail
            });
        if joins {
            if let Some(chunk) = self.new.last_mut() {
                chunk.text.push_str(text);
            }
            if in_tail && let Some(last) = self.tail.back_mut() {
                last.1 += text.len() as i64;
            }
        } else {
            self.new.push(Chunk {
                seq: self.next_seq,
                stream,
                at_byte: self.at_byte,
                lost: std::mem::take(&mut self.lost),
                text: text.to_owned(),
            });
            if in_tail {
                self.tail.push_back((self.next_seq, text.len() as i64));
            }
            self.next_seq += 1;
        }
        if in_tail {
            self.tail_bytes += text.len() as i64;
        }
        self.at_byte += text.len() as i64;
    }

    /// Lets the oldest tail chunks go while the tail is over its share:
    /// an unwritten one longer than the excess, or the only one, loses its
    /// front instead.
    fn trim_tail(&mut self) {
        while self.tail_bytes > self.tail_max {
            let Some(&(seq, len)) = self.tail.front() else {
                return;
            };
            let over = self.tail_bytes - self.tail_max;
            let only = self.tail.len() == 1;
            match self.new.iter().position(|c| c.seq == seq) {
                Some(i) if over < len || only => {
                    let chunk = &mut self.new[i];
                    let cut = ceil_char_boundary(&chunk.text, usize::try_from(over).unwrap_or(0));
                    chunk.text.drain(..cut);
                    chunk.at_byte += cut as i64;
                    self.tail_bytes -= cut as i64;
                    self.tail[0].1 -= cut as i64;
                    return;
                }
                Some(i) => {
                    let chunk = self.new.remove(i);
                    // What it carried as lost stays told, on the chunk after.
                    if let Some(next) = self.new.get_mut(i) {
                        next.lost += chunk.lost;
                    }
                }
                None if only => return,
                None => {
                    self.gone = Some(match self.gone {
                        Some((first, _)) => (first, seq),
                        None => (seq, seq),
                    });
                }
            }
            self.tail.pop_front();
            self.tail_bytes -= len;
        }
    }

    /// The chunks to write now, and the written ones to drop.
    fn take_new(&mut self) -> (Vec<Chunk>, Option<(i32, i32)>) {
        (std::mem::take(&mut self.new), self.gone.take())
    }

    /// `chunks` could not be written: told as lost before the next one.
    fn unwritten(&mut self, chunks: &[Chunk]) {
        let bytes: i64 = chunks.iter().map(|c| c.text.len() as i64 + c.lost).sum();
        self.lost += bytes;
        for chunk in chunks {
            if let Some(i) = self.tail.iter().position(|(seq, _)| *seq == chunk.seq)
                && let Some((_, len)) = self.tail.remove(i)
            {
                self.tail_bytes -= len;
            }
        }
    }
}

/// The largest character boundary of `text` at or before `at`.
fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The smallest character boundary of `text` at or after `at`.
fn ceil_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_text(kept: &Kept) -> Vec<(i64, String)> {
        kept.new
            .iter()
            .map(|c| (c.at_byte, c.text.clone()))
            .collect()
    }

    #[test]
    fn the_head_and_the_tail_are_kept_and_the_middle_shows_as_a_gap() {
        let mut kept = Kept::new(8);
        for piece in ["ab", "cd", "ef", "gh", "ij", "kl"] {
            kept.add(Stream::Stdout, piece);
        }
        // Head: the first 4 bytes; tail: the last 4, in chunks of one
        // stream joined while nothing is between them.
        let chunks = kept_text(&kept);
        assert_eq!(chunks.first(), Some(&(0, "abcd".to_string())));
        let tail: String = chunks[1..].iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(tail, "ijkl");
        assert_eq!(chunks[1].0, 8, "the tail starts where it was printed");
    }

    #[test]
    fn written_tail_chunks_the_tail_lets_go_are_dropped_by_their_range() {
        let mut kept = Kept::new(4);
        kept.add(Stream::Stdout, "ab");
        kept.add(Stream::Stderr, "cd");
        let _ = kept.take_new();
        kept.add(Stream::Stdout, "ef");
        kept.add(Stream::Stderr, "gh");
        let (new, gone) = kept.take_new();
        assert_eq!(gone, Some((1, 1)), "the written `cd` goes");
        let texts: Vec<&str> = new.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, ["gh"], "`ef` went before it was written");
    }

    #[test]
    fn lost_bytes_are_placed_before_the_next_chunk() {
        let mut kept = Kept::new(1 << 20);
        kept.add(Stream::Stdout, "one\n");
        kept.note_lost(100);
        kept.add(Stream::Stdout, "two\n");
        let (new, _) = kept.take_new();
        assert_eq!(new.len(), 2);
        assert_eq!((new[1].at_byte, new[1].lost), (104, 100));
    }

    #[test]
    fn a_piece_larger_than_the_tail_keeps_its_end_cut_at_a_character() {
        let mut kept = Kept::new(6);
        kept.add(Stream::Stdout, "héllo wörld");
        let texts = kept_text(&kept);
        assert_eq!(texts[0], (0, "hé".to_string()));
        let (at, tail) = &texts[1];
        assert!(tail.len() <= 3 && "héllo wörld".ends_with(tail.as_str()));
        assert_eq!(*at as usize + tail.len(), "héllo wörld".len());
    }
}
