"""The Lightning-free core: a round's arithmetic and the data it runs on, as plain functions and small classes.

Nothing here imports Lightning (an import contract checks it), so these units serve any training loop: planning a
round (:mod:`~fl_lightning.core.rounds`), reducing the clients' uploads (:mod:`~fl_lightning.core.aggregation`), the
server optimizers (:mod:`~fl_lightning.core.server_optim`), partitions (:mod:`~fl_lightning.core.partitions`), the
methods' losses (:mod:`~fl_lightning.core.losses`), evaluation and metrics, datasets and networks.
"""
