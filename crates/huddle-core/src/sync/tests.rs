//! Unit tests of the synchronizer.
