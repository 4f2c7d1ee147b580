"""etcd: the client, shard and singleton leadership, the replica registry and the cluster view."""
