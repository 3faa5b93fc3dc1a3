"""The end every fixture script here gives its GGUFWriter (imported from this folder,
which Python puts on sys.path for a script run from it)."""


def finish(writer):
    """Writes the header, the metadata and the tensors of `writer`, then closes its files.

    GGUFWriter only accepts this order; with split_max_tensors it writes every shard.
    """
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
