//! Integration tests of mlxcel-media: the oracle's image corpus decoded pixel for pixel, and the
//! limits and refusals on hand-made headers.

mod corpus;
mod limits;
