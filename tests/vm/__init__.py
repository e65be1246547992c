"""The VM test tier: the ``b300`` stack's EC2 user data (the GPU instance's, and the ``phase: stage``
stager's) booted for real in QEMU guests.

``guest_env`` (what differs from an EC2 p6-b300 on the DLAMI, each with its reason), ``image``
(the guest image, built from ``components/aws/ami_contract.py`` and cached by content hash),
``standin_image`` and ``standin_vllm`` (the small image standing in for vllm/vllm-openai and its
``vllm`` entry point), ``services`` (instance metadata, S3/SSM, the hub and the registry stood in
on the host's 127.0.0.1) with ``relay`` (QEMU's guestfwd to them), ``guest`` (QEMU, its disks,
the NoCloud seed and the guest agent), ``machine`` (one instance: plan, stand-ins seeded as
``pulumi up`` would, guest; ``Stager``: the stager on the same stand-ins), ``record`` (the
measured phases the plan cites). Scenarios: tests/test_vm_boot.py.
"""
