//! The storage-version migrator (see the migrator issue).
