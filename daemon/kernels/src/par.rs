//! Plumbing for loops whose tasks write disjoint parts of one buffer, shared by the
//! activation quantization here ([`crate::act::Activations::quantize_par`]) and the
//! daemon's compute team.

/// A raw pointer that may cross threads. Whoever hands it to tasks guarantees that
/// they access disjoint elements while the buffer is exclusively borrowed; each use
/// says why in its `SAFETY` comment.
pub struct SendPtr<T>(pub *mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SendPtr<T> {}

// SAFETY: a `SendPtr` is only a pointer; the code that dereferences it gives each task
// a disjoint range (see the type's documentation).
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SendPtr<T> {}
