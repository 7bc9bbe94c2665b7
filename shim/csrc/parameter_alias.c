// A second key for a parameter index entry. Written in C so the entry is
// copied with IREE's own struct layout (iree/io/parameter_index.h) rather than
// a Rust mirror of it.

#include <string.h>

#include "iree/io/parameter_index.h"

// Adds `alias` to `index` naming the same bytes as the entry `key` names (the
// same file, offset and length). The index copies the key and retains the
// file handle, so nothing here needs to outlive the call.
iree_status_t mlxcel_parameter_index_alias(iree_io_parameter_index_t* index,
                                           iree_string_view_t key,
                                           iree_string_view_t alias) {
  const iree_io_parameter_index_entry_t* found = NULL;
  IREE_RETURN_IF_ERROR(iree_io_parameter_index_lookup(index, key, &found));
  iree_io_parameter_index_entry_t entry = *found;
  entry.key = alias;
  return iree_io_parameter_index_add(index, &entry);
}

// Adds `key` to `index` as the first `length` bytes of `handle` (a host
// allocation the caller wrapped; the index retains it).
iree_status_t mlxcel_parameter_index_add_handle(iree_io_parameter_index_t* index,
                                                iree_string_view_t key,
                                                iree_io_file_handle_t* handle,
                                                uint64_t length) {
  iree_io_parameter_index_entry_t entry;
  memset(&entry, 0, sizeof(entry));
  entry.key = key;
  entry.length = length;
  entry.type = IREE_IO_PARAMETER_INDEX_ENTRY_STORAGE_TYPE_FILE;
  entry.storage.file.handle = handle;
  entry.storage.file.offset = 0;
  return iree_io_parameter_index_add(index, &entry);
}
