//! Layers of the decoder loop that hold weights: [`linear`] (the one place a matrix is
//! applied).

pub mod linear;

pub use linear::{Linear, Part, Proj, Projection, Site};
