"""The repository's own networks: ``dscnn_cifar10.h5``, trained by ``scripts/train_dscnn_cifar10.py``
(``model=dscnn``, conf/model/dscnn.yaml)."""
