//! FStream's native data path (issue 29): BLAKE3 subtree hashing of blocks where they land.
//!
//! BLAKE3 is a binary tree over 1 KiB chunks (section 2.1 of the BLAKE3 paper): a file's blocks that
//! arrive out of order on parallel streams can each be hashed as subtrees of the file's tree, and their
//! 32-byte chaining values merged when the file closes, giving exactly `blake3(file)` (keyed or not)
//! without reading the file back. The `hazmat` module of the `blake3` crate gives the pieces
//! (`set_input_offset`, `finalize_non_root`, `merge_subtrees_*`); this module adds:
//!
//! * `BlockTree`: the pieces of one data block, fed from a socket (`pump`: recv → pwrite → hash, with
//!   the GIL released) or from memory (`feed`: TLS and sealed blocks);
//! * `subtree_fd`: one node of the tree read back from a file (the ranges no block covered: a resumed
//!   part's prefix, block edges that are not chunk-aligned);
//! * `merge`: two children into their parent (or the root).
//!
//! Which byte ranges are nodes of the tree: `next_piece`. Everything here is checked against
//! `blake3.blake3` (the Python package) in `tests/test_tree_hash.py` on many sizes and block layouts.

use std::cell::RefCell;

use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode};
use blake3::{Hasher, CHUNK_LEN};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyEOFError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

const BUF_LEN: usize = 1 << 20;
const CHUNK: u64 = CHUNK_LEN as u64;

thread_local! {
    // one reused buffer per thread: it stays in the CPU's cache between the recv, the write and the hash
    static BUFFER: RefCell<Vec<u8>> = RefCell::new(vec![0u8; BUF_LEN]);
}

type Key = Option<[u8; 32]>;

fn parse_key(key: Option<&[u8]>) -> PyResult<Key> {
    match key {
        None => Ok(None),
        Some(k) => {
            let arr: [u8; 32] = k
                .try_into()
                .map_err(|_| PyValueError::new_err(format!("blake3 tree: a key must be 32 bytes, not {}", k.len())))?;
            Ok(Some(arr))
        }
    }
}

fn new_hasher(key: &Key, offset: u64) -> Hasher {
    let mut h = match key {
        Some(k) => Hasher::new_keyed(k),
        None => Hasher::new(),
    };
    if offset > 0 {
        h.set_input_offset(offset);
    }
    h
}

fn mode(key: &Key) -> Mode<'_> {
    match key {
        Some(k) => Mode::KeyedHash(k),
        None => Mode::Hash,
    }
}

fn prev_pow2(n: u64) -> u64 {
    1u64 << (63 - n.leading_zeros())
}

/// The piece of the file's tree that starts at `pos` inside a block ending at `end`, for a file of `size`
/// bytes: (length, is a node). A node starts on a chunk boundary and is either a power-of-two number of
/// chunks no longer than the largest power of two dividing its start (a full subtree), or the file's tail
/// from such a start (a subtree on the tree's right edge; the root when it starts at 0). Bytes before the
/// next chunk boundary, or under one chunk before a block edge mid-file, are not a node.
fn next_piece(pos: u64, end: u64, size: u64) -> (u64, bool) {
    if pos % CHUNK != 0 {
        let next = (pos / CHUNK + 1) * CHUNK;
        return (next.min(end) - pos, false);
    }
    let left = end - pos;
    let cap = if pos == 0 { u64::MAX } else { 1u64 << pos.trailing_zeros() };
    if end == size && left <= cap {
        return (left, true);
    }
    let s = prev_pow2(left).min(cap);
    if s < CHUNK {
        return (left, false);
    }
    (s, true)
}

struct Current {
    start: u64,
    len: u64,
    fed: u64,
    hasher: Option<Hasher>,
}

/// The pieces of one block [pos, end) of a file of `size` bytes, hashed as their bytes pass.
struct Pieces {
    key: Key,
    size: u64,
    end: u64,
    pos: u64,
    cur: Option<Current>,
    done: Vec<(u64, u64, [u8; 32], bool)>,
}

impl Pieces {
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() && self.pos < self.end {
            if self.cur.is_none() {
                let (len, node) = next_piece(self.pos, self.end, self.size);
                let hasher = if node { Some(new_hasher(&self.key, self.pos)) } else { None };
                self.cur = Some(Current { start: self.pos, len, fed: 0, hasher });
            }
            let cur = self.cur.as_mut().unwrap();
            let take = (data.len() as u64).min(cur.len - cur.fed) as usize;
            if let Some(h) = cur.hasher.as_mut() {
                h.update(&data[..take]);
            }
            cur.fed += take as u64;
            self.pos += take as u64;
            data = &data[take..];
            if cur.fed == cur.len {
                let cur = self.cur.take().unwrap();
                if let Some(h) = cur.hasher {
                    let root = cur.start == 0 && cur.len == self.size;
                    let out: [u8; 32] = if root { *h.finalize().as_bytes() } else { h.finalize_non_root() };
                    self.done.push((cur.start, cur.len, out, root));
                }
            }
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// recv up to `buf.len()` bytes (all of them unless the peer closes or fails): (bytes, errno; -1 = EOF).
fn recv_full(sock: i32, buf: &mut [u8], timeout_ms: i32) -> (usize, i32) {
    let mut got = 0usize;
    while got < buf.len() {
        let n = unsafe {
            libc::recv(sock, buf[got..].as_mut_ptr() as *mut libc::c_void, buf.len() - got, libc::MSG_WAITALL)
        };
        if n > 0 {
            got += n as usize;
            continue;
        }
        if n == 0 {
            return (got, -1);
        }
        let e = errno();
        if e == libc::EINTR {
            continue;
        }
        if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
            // a socket with a timeout is non-blocking underneath (Python's settimeout): wait for it here
            let mut pfd = libc::pollfd { fd: sock, events: libc::POLLIN, revents: 0 };
            let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
            if r == 0 {
                return (got, libc::ETIMEDOUT);
            }
            if r < 0 && errno() != libc::EINTR {
                return (got, errno());
            }
            continue;
        }
        return (got, e);
    }
    (got, 0)
}

/// Repeat one positioned I/O call until `len` bytes are done: (bytes done, errno). `io(done)` makes the call for
/// the bytes from `done` on and returns what the syscall returns; EINTR is retried, and a call that moves nothing
/// is EIO (a file that ends first, a device that takes no more).
fn io_all(len: usize, mut io: impl FnMut(usize) -> isize) -> (usize, i32) {
    let mut done = 0usize;
    while done < len {
        let n = io(done);
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return (done, e);
        }
        if n == 0 {
            return (done, libc::EIO);
        }
        done += n as usize;
    }
    (done, 0)
}

/// pwrite all of `data` at `off`: (bytes written, errno).
fn pwrite_all(fd: i32, data: &[u8], off: u64) -> (usize, i32) {
    io_all(data.len(), |done| {
        let rest = &data[done..];
        unsafe { libc::pwrite(fd, rest.as_ptr() as *const libc::c_void, rest.len(), (off + done as u64) as libc::off_t) }
    })
}

/// One data block [offset, offset + length) of a file of `size` bytes, hashed into tree pieces as it passes.
///
/// `at` is where the next byte of the block goes; the pieces follow it as long as every byte was written. A
/// chunk that was not written (a file given up, a failed write) stops the hashing for the rest of the block:
/// no piece after it is ever returned, and the commit reads those bytes back.
#[pyclass(module = "transfer_agent.storage._blake3tree")]
struct BlockTree {
    p: Pieces,
    at: u64,
    dead: bool,
}

impl BlockTree {
    fn landed(&mut self, data: &[u8], written: bool) {
        if written && !self.dead {
            self.p.feed(data);
        } else {
            self.dead = true;
            self.p.cur = None;
        }
        self.at += data.len() as u64;
    }
}

/// splice(2) without offsets, retrying on EINTR: bytes moved, or an errno.
fn splice_in(from: i32, to: i32, len: usize) -> Result<usize, i32> {
    loop {
        let n = unsafe { libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, libc::SPLICE_F_MOVE) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// Move `n` bytes from the pipe into `fd` at `off`: (bytes moved, errno).
fn splice_out(pipe_r: i32, fd: i32, off: u64, n: usize) -> (usize, i32) {
    io_all(n, |m| {
        let mut o = (off + m as u64) as libc::loff_t;
        unsafe { libc::splice(pipe_r, std::ptr::null_mut(), fd, &mut o, n - m, libc::SPLICE_F_MOVE) }
    })
}

/// pread exactly `buf.len()` bytes at `off`: 0, or an errno (EIO for a file that ends first).
fn pread_all(fd: i32, buf: &mut [u8], off: u64) -> i32 {
    let len = buf.len();
    io_all(len, |got| unsafe {
        libc::pread(fd, buf[got..].as_mut_ptr() as *mut libc::c_void, len - got, (off + got as u64) as libc::off_t)
    })
    .1
}

#[pymethods]
impl BlockTree {
    #[new]
    #[pyo3(signature = (offset, length, size, key=None))]
    fn new(offset: u64, length: u64, size: u64, key: Option<&[u8]>) -> PyResult<Self> {
        let end = offset.checked_add(length).filter(|e| *e <= size).ok_or_else(|| {
            PyValueError::new_err(format!("blake3 tree: block [{offset}, +{length}) beyond the file's {size} bytes"))
        })?;
        Ok(BlockTree {
            p: Pieces { key: parse_key(key)?, size, end, pos: offset, cur: None, done: Vec::new() },
            at: offset,
            dead: false,
        })
    }

    /// Receive up to `want` bytes (at most 1 MiB) of the block from socket `sock`, write them into `fd` at
    /// their offset (`fd` < 0: drop them) and hash them, all without the GIL. Returns (received, written,
    /// write errno, recv errno): a recv errno of -1 is the peer's end of stream, ETIMEDOUT the socket's
    /// timeout (`timeout_ms`, -1 for none).
    #[pyo3(signature = (sock, fd, want, timeout_ms=-1))]
    fn pump(&mut self, py: Python<'_>, sock: i32, fd: i32, want: usize, timeout_ms: i32) -> (usize, usize, i32, i32) {
        let want = want.min(BUF_LEN).min((self.p.end - self.at) as usize);
        py.detach(|| {
            BUFFER.with(|cell| {
                let mut buf = cell.borrow_mut();
                let (got, rerr) = recv_full(sock, &mut buf[..want], timeout_ms);
                let (written, werr) = if fd >= 0 && got > 0 { pwrite_all(fd, &buf[..got], self.at) } else { (0, 0) };
                self.landed(&buf[..got], fd >= 0 && written == got);
                (got, written, werr, rerr)
            })
        })
    }

    /// Move up to `want` bytes of the block socket → pipe → file with splice(2), each chunk hashed right after
    /// it landed (read back while it is still in the CPU's cache), the whole call without the GIL. `fd` < 0:
    /// the bytes are read and dropped (a file given up). Returns (moved, written, write errno, recv errno):
    /// moved bytes left the socket, written ones are in the file; a recv errno of -1 is the peer's end of
    /// stream. After a failed write the call drops the rest of what it moves.
    fn splice(&mut self, py: Python<'_>, sock: i32, pipe_r: i32, pipe_w: i32, fd: i32, want: usize) -> (usize, usize, i32, i32) {
        let want = want.min((self.p.end - self.at) as usize);
        py.detach(|| {
            BUFFER.with(|cell| {
                let mut buf = cell.borrow_mut();
                let (mut moved, mut written, mut werr, mut rerr) = (0usize, 0usize, 0i32, 0i32);
                while moved < want {
                    let n = match splice_in(sock, pipe_w, (want - moved).min(BUF_LEN)) {
                        Ok(0) => {
                            rerr = -1;
                            break;
                        }
                        Ok(n) => n,
                        Err(e) => {
                            rerr = e;
                            break;
                        }
                    };
                    let mut m = 0usize;
                    let mut hashable = false;
                    if fd >= 0 && werr == 0 {
                        let (k, e) = splice_out(pipe_r, fd, self.at, n);
                        m = k;
                        werr = e;
                        if k == n {
                            written += n;
                            // read back what just landed, while it is still in the CPU's cache
                            hashable = !self.dead && pread_all(fd, &mut buf[..n], self.at) == 0;
                        }
                    }
                    while m < n {
                        // nothing to write into, or the write failed: drop what is in the pipe
                        let k = unsafe { libc::read(pipe_r, buf.as_mut_ptr() as *mut libc::c_void, (n - m).min(BUF_LEN)) };
                        if k < 0 && errno() == libc::EINTR {
                            continue;
                        }
                        if k <= 0 {
                            break;
                        }
                        m += k as usize;
                    }
                    if hashable {
                        self.landed(&buf[..n], true);
                    } else {
                        self.dead = true;
                        self.p.cur = None;
                        self.at += n as u64;
                    }
                    moved += n;
                }
                (moved, written, werr, rerr)
            })
        })
    }

    /// Hash bytes of the block already in memory (a TLS or sealed block, written), in order, without the GIL.
    fn feed(&mut self, py: Python<'_>, data: PyBuffer<u8>) -> PyResult<()> {
        if !data.is_c_contiguous() {
            return Err(PyValueError::new_err("blake3 tree: feed needs a contiguous buffer"));
        }
        // SAFETY: the buffer is held (and its exporter's memory pinned) until this function returns
        let bytes = unsafe { std::slice::from_raw_parts(data.buf_ptr() as *const u8, data.len_bytes()) };
        if self.at + bytes.len() as u64 > self.p.end {
            return Err(PyValueError::new_err("blake3 tree: more bytes than the block holds"));
        }
        py.detach(|| self.landed(bytes, true));
        Ok(())
    }

    /// The block's next offset (what was received so far ends here).
    #[getter]
    fn position(&self) -> u64 {
        self.at
    }

    /// The pieces finished since the last call: [(start, length, 32-byte value, is the root)].
    fn take<'py>(&mut self, py: Python<'py>) -> Vec<(u64, u64, Bound<'py, PyBytes>, bool)> {
        self.p.done.drain(..).map(|(s, l, cv, root)| (s, l, PyBytes::new(py, &cv), root)).collect()
    }
}

/// The value of node [start, start + length) of a file of `size` bytes, read back from `fd` (the root's
/// hash when the node is the whole file). Raises EOFError if the file is shorter.
#[pyfunction]
#[pyo3(signature = (fd, start, length, size, key=None))]
fn subtree_fd<'py>(py: Python<'py>, fd: i32, start: u64, length: u64, size: u64, key: Option<&[u8]>) -> PyResult<Bound<'py, PyBytes>> {
    let key = parse_key(key)?;
    if start % CHUNK != 0 || start + length > size || (length == 0 && size != 0) {
        return Err(PyValueError::new_err(format!("blake3 tree: [{start}, +{length}) is not a node of a {size}-byte file")));
    }
    let res: Result<[u8; 32], (i32, u64)> = py.detach(|| {
        BUFFER.with(|cell| {
            let mut buf = cell.borrow_mut();
            let mut h = new_hasher(&key, start);
            let mut off = start;
            let end = start + length;
            while off < end {
                let want = ((end - off) as usize).min(BUF_LEN);
                let n = unsafe { libc::pread(fd, buf.as_mut_ptr() as *mut libc::c_void, want, off as libc::off_t) };
                if n < 0 {
                    let e = errno();
                    if e == libc::EINTR {
                        continue;
                    }
                    return Err((e, off));
                }
                if n == 0 {
                    return Err((0, off));
                }
                h.update(&buf[..n as usize]);
                off += n as u64;
            }
            if start == 0 && length == size {
                Ok(*h.finalize().as_bytes())
            } else {
                Ok(h.finalize_non_root())
            }
        })
    });
    match res {
        Ok(v) => Ok(PyBytes::new(py, &v)),
        Err((0, off)) => Err(PyEOFError::new_err(format!("file shorter than expected ({off} of {} bytes)", start + length))),
        Err((e, _)) => Err(PyOSError::new_err((e, std::io::Error::from_raw_os_error(e).to_string()))),
    }
}

/// Merge two children's values into their parent's (`root`: the parent is the whole file: its hash).
#[pyfunction]
#[pyo3(signature = (left, right, key=None, root=false))]
fn merge<'py>(py: Python<'py>, left: &[u8], right: &[u8], key: Option<&[u8]>, root: bool) -> PyResult<Bound<'py, PyBytes>> {
    let key = parse_key(key)?;
    let l: ChainingValue = left.try_into().map_err(|_| PyValueError::new_err("blake3 tree: a chaining value is 32 bytes"))?;
    let r: ChainingValue = right.try_into().map_err(|_| PyValueError::new_err("blake3 tree: a chaining value is 32 bytes"))?;
    let out: [u8; 32] = if root {
        *merge_subtrees_root(&l, &r, mode(&key)).as_bytes()
    } else {
        merge_subtrees_non_root(&l, &r, mode(&key))
    };
    Ok(PyBytes::new(py, &out))
}

#[pymodule]
fn _blake3tree(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BlockTree>()?;
    m.add_function(wrap_pyfunction!(subtree_fd, m)?)?;
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    m.add("BUFFER", BUF_LEN)?;
    Ok(())
}
