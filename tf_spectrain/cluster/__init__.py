"""Several hosts: cluster specs, the worker's server, and the trainer's connection.

- `spec`: the `Cluster`, `--cluster h0:p0,h1:p1,...` and `--task` (pure Python, as are the
  next four).
- `addresses`: the `host:port` rule.
- `tf_config`: the `TF_CONFIG` variable.
- `slots`: the cluster and slot of a worker or the trainer, from its flags or `TF_CONFIG`.
- `device_names`: worker device names; the devices the stages take.
- `sockets`: what a process listens on (`/proc`), whether an address accepts connections.
- `server`: the TensorFlow server of one worker (`python -m tf_spectrain.app.worker`).
- `record`: the versions record a worker publishes in a TensorFlow variable.
- `reach`: the address the workers reach the trainer at (pure Python).
- `connect`: `connect_cluster`, the trainer's side.

TensorFlow's server runs any graph sent by anyone who can reach its port, and TensorFlow
2.21 listens on every interface: use trusted networks only.
"""

from tf_spectrain.cluster.connect import check_versions, connect_cluster, trainer_job
from tf_spectrain.cluster.device_names import stage_devices
from tf_spectrain.cluster.server import WildcardBindError, WorkerServer, start_worker
from tf_spectrain.cluster.slots import trainer_cluster, worker_slot
from tf_spectrain.cluster.spec import Cluster, parse_cluster
from tf_spectrain.cluster.tf_config import parse_tf_config

__all__ = [
    "Cluster",
    "WildcardBindError",
    "WorkerServer",
    "check_versions",
    "connect_cluster",
    "parse_cluster",
    "parse_tf_config",
    "stage_devices",
    "start_worker",
    "trainer_cluster",
    "trainer_job",
    "worker_slot",
]
