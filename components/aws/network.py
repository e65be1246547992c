"""Network: a VPC with private subnets (or an existing VPC and subnets), the S3 gateway
endpoint, and the security groups.

New VPC layout (``network.vpcCidr`` split into sixteenths):
- two private subnets: the GPU AZ (where nodes, FSx and the capacity reservation live) and a
  second AZ (EKS needs subnets in two AZs for its control plane);
- one public subnet in the GPU AZ holding the NAT gateway (image pulls and the hub download
  leave through it; nothing is reachable from the internet);
- the S3 gateway endpoint on the private route table, so mirror traffic stays in-region and
  never crosses the NAT gateway (which bills per GB).

GPU zone in a Local Zone (``us-east-1-dfw-2a``; capacity blocks for P6e UltraServers are sold
there too): EKS refuses Local Zone subnets for its control plane, and of the EKS-related
resources only managed node groups, self-managed nodes, EBS volumes and Application Load
Balancers are supported in Local Zones (EKS user guide, "Launch low-latency EKS clusters with AWS
Local Zones"): no NLB, and the NAT gateway belongs in the parent region. So the layout becomes:
the GPU subnet alone in the Local Zone (GPU nodes only,
no load-balancer tags); two private subnets in two parent-region AZs (``private-second``,
``private-third``: EKS control plane, system nodes, internal load balancers); the public subnet
and NAT gateway in the first of them. With an existing VPC, ``network.privateSubnetIds`` must
then also name parent-region subnets; those (not the Local Zone one) go to the control plane.

Security groups: none allows ingress from 0.0.0.0/0. The ``gpu`` group admits the vLLM port
only from ``network.allowedCidrs`` and ``network.allowedSecurityGroupIds`` (and itself, for
multi-node rendezvous). The ``efa`` group (all traffic to and from itself) exists when EFA is on.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from components.core.config import DeploymentSpec
from components.core.errors import ConfigError
from components.core.targets import is_local_zone
from components.core.versions import VLLM_MASTER_PORT

from .common import child, tags

# Lustre client traffic (FSx for Lustre user guide, "File system access control with Amazon VPC").
LUSTRE_PORTS: tuple[tuple[int, int], ...] = ((988, 988), (1018, 1023))
ANY_IPV4 = "0.0.0.0/0"


def subnet_cidrs(vpc_cidr: str) -> dict[str, str]:
    """CIDRs of the new VPC's subnets: ``private-gpu``, ``private-second``, ``private-third``
    (used with a Local Zone GPU zone only), ``public``.

    Each is a sixteenth of ``vpc_cidr`` (a /16 gives /20s: 4,091 addresses per subnet).
    """
    net = ipaddress.ip_network(vpc_cidr)
    blocks = list(net.subnets(new_prefix=net.prefixlen + 4))
    return {
        "private-gpu": str(blocks[0]),
        "private-second": str(blocks[1]),
        "private-third": str(blocks[2]),
        "public": str(blocks[8]),
    }


def gpu_availability_zone(spec: DeploymentSpec) -> str:
    """The AZ GPU nodes are pinned to: the reservation's, the configured one, else the first AZ of
    the region that offers the instance type (``targets.py`` offering facts).

    Raises:
        ConfigError: no AZ can be chosen (parse_spec rejects this earlier for known stacks).
    """
    if spec.availability_zone:
        return spec.availability_zone
    offered = spec.instance.offered_azs.get(spec.region or "", ())
    if offered:
        return offered[0]
    raise ConfigError("compute.availabilityZone", None, f"is required: no offering facts for {spec.instance.instance_type}")


@dataclass
class NetworkArgs:
    """Inputs of ``Network``.

    Attributes:
        spec: the deployment spec (network and compute settings).
        tags: the stack's tags.
        region: the AWS region.
        cluster_name: EKS cluster name, to tag subnets for internal load balancers (None on EC2).
    """

    spec: DeploymentSpec
    tags: dict[str, Any]
    region: str
    cluster_name: str | None = None


class Network(pulumi.ComponentResource):
    """VPC, subnets, NAT, S3 gateway endpoint and security groups.

    Attributes:
        vpc_id: the VPC.
        private_subnet_ids: the private subnets of the EKS control plane and system nodes (every
            private subnet; with a Local Zone GPU zone only the parent-region ones).
        gpu_subnet_ids: private subnets in the GPU AZ (GPU nodes, FSx).
        node_subnet_cidrs: CIDR blocks of the subnets nodes launch in, which vpc-cni gives pods
            their addresses from too (plain strings for a new VPC, look-ups of an existing one's).
        local_zone: whether the GPU zone is a Local Zone (plain bool).
        gpu_availability_zone: the GPU AZ (plain string).
        gpu_security_group_id: GPU nodes' group (vLLM port from allowed sources only).
        efa_security_group_id: the EFA group, or None when EFA is off.
        efa_security_group_rules: the EFA group's rules (empty when EFA is off): what uses the
            group at creation (FSx validates its rules) depends on them.
        s3_endpoint_id: the S3 gateway endpoint, or None when not created.
    """

    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    gpu_subnet_ids: pulumi.Output[list[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("kimi-deploy:aws:Network", name, None, opts)
        self._args = args
        spec = args.spec
        net = spec.config.network
        self.gpu_availability_zone = gpu_availability_zone(spec)
        self.local_zone = is_local_zone(self.gpu_availability_zone)
        self.s3_endpoint_id: pulumi.Output[str] | None = None
        self.efa_security_group_rules: list[pulumi.Resource] = []
        if net.vpc_id:
            self._use_existing(name, net.vpc_id)
        else:
            self._create_vpc(name)
        self.gpu_security_group_id = self._create_gpu_security_group(name)
        self.efa_security_group_id = (
            self._create_efa_security_group(name) if (spec.efa_enabled or spec.config.storage.fsx.efa) else None
        )
        outputs: dict[str, Any] = {
            "vpcId": self.vpc_id,
            "privateSubnetIds": self.private_subnet_ids,
            "gpuSubnetIds": self.gpu_subnet_ids,
            "gpuAvailabilityZone": self.gpu_availability_zone,
            "gpuSecurityGroupId": self.gpu_security_group_id,
        }
        if self.efa_security_group_id is not None:
            outputs["efaSecurityGroupId"] = self.efa_security_group_id
        self.register_outputs(outputs)

    # -- existing VPC ---------------------------------------------------------------------
    def _use_existing(self, name: str, vpc_id: str) -> None:
        spec, net = self._args.spec, self._args.spec.config.network
        ids = list(net.private_subnet_ids)
        az = self.gpu_availability_zone
        # A synchronous look-up, so a reservation in another AZ than the subnets stops the
        # program before anything is declared.
        found = aws.ec2.get_subnets(
            filters=[
                aws.ec2.GetSubnetsFilterArgs(name="vpc-id", values=[vpc_id]),
                aws.ec2.GetSubnetsFilterArgs(name="subnet-id", values=ids),
                aws.ec2.GetSubnetsFilterArgs(name="availability-zone", values=[az]),
            ]
        ).ids
        if not found:
            why = "the capacity reservation's AZ" if spec.config.compute.capacity.availability_zone else "the GPU AZ"
            raise ConfigError(
                "network.privateSubnetIds",
                ids,
                f"has no subnet of {vpc_id} in {az} ({why}; GPU nodes and FSx must launch there)",
            )
        self.vpc_id = pulumi.Output.from_input(vpc_id)
        control_plane = [i for i in ids if i not in found] if self.local_zone else ids
        if not control_plane:
            raise ConfigError(
                "network.privateSubnetIds",
                ids,
                f"has only subnets in the Local Zone {az}: EKS and the NAT path need subnets in two parent-region AZs too",
            )
        self.private_subnet_ids = pulumi.Output.from_input(control_plane)
        self.gpu_subnet_ids = pulumi.Output.from_input(sorted(found, key=ids.index))
        self.node_subnet_cidrs: tuple[pulumi.Input[str], ...] = tuple(
            aws.ec2.get_subnet_output(id=subnet_id).cidr_block for subnet_id in ids
        )
        if net.s3_gateway_endpoint:
            tables = aws.ec2.get_route_tables_output(
                filters=[aws.ec2.GetRouteTablesFilterArgs(name="association.subnet-id", values=ids)]
            )
            self._create_s3_endpoint(name, self.vpc_id, tables.ids)

    # -- new VPC --------------------------------------------------------------------------
    def _create_vpc(self, name: str) -> None:
        a = self._args
        spec, net = a.spec, a.spec.config.network
        cidrs = subnet_cidrs(net.vpc_cidr)
        az = self.gpu_availability_zone
        second_az: pulumi.Input[str]
        third_az: pulumi.Output[str] | None
        public_az: pulumi.Input[str]
        if self.local_zone:
            second_az, third_az = self._parent_azs()
            public_az = second_az
        else:
            second_az, third_az, public_az = self._second_az(az), None, az
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=net.vpc_cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags=tags(a.tags, f"{spec.stack}-vpc"),
            opts=child(self),
        )
        # The default security group of a new VPC allows all traffic between its members; take
        # every rule away so nothing can rely on it.
        aws.ec2.DefaultSecurityGroup(
            f"{name}-default-sg", vpc_id=vpc.id, tags=tags(a.tags, f"{spec.stack}-default-closed"), opts=child(self)
        )
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=tags(a.tags, f"{spec.stack}-igw"), opts=child(self))
        public = aws.ec2.Subnet(
            f"{name}-public",
            vpc_id=vpc.id,
            cidr_block=cidrs["public"],
            availability_zone=public_az,
            map_public_ip_on_launch=False,
            tags={**tags(a.tags), "Name": pulumi.Output.concat(spec.stack, "-public-", public_az)},
            opts=child(self),
        )
        public_rt = aws.ec2.RouteTable(
            f"{name}-public-rt", vpc_id=vpc.id, tags=tags(a.tags, f"{spec.stack}-public"), opts=child(self)
        )
        aws.ec2.Route(
            f"{name}-public-default",
            route_table_id=public_rt.id,
            destination_cidr_block=ANY_IPV4,
            gateway_id=igw.id,
            opts=child(self),
        )
        aws.ec2.RouteTableAssociation(f"{name}-public-assoc", subnet_id=public.id, route_table_id=public_rt.id, opts=child(self))
        eip = aws.ec2.Eip(f"{name}-nat-eip", domain="vpc", tags=tags(a.tags, f"{spec.stack}-nat"), opts=child(self))
        nat = aws.ec2.NatGateway(
            f"{name}-nat",
            allocation_id=eip.id,
            subnet_id=public.id,
            tags=tags(a.tags, f"{spec.stack}-nat"),
            opts=child(self, depends_on=[igw]),
        )
        private_rt = aws.ec2.RouteTable(
            f"{name}-private-rt", vpc_id=vpc.id, tags=tags(a.tags, f"{spec.stack}-private"), opts=child(self)
        )
        aws.ec2.Route(
            f"{name}-private-default",
            route_table_id=private_rt.id,
            destination_cidr_block=ANY_IPV4,
            nat_gateway_id=nat.id,
            opts=child(self),
        )
        subnet_tags: dict[str, Any] = {}
        if a.cluster_name:
            # Internal load balancers (the internal NLB of the vLLM Service) land here.
            subnet_tags = {"kubernetes.io/role/internal-elb": "1", f"kubernetes.io/cluster/{a.cluster_name}": "shared"}
        private = []
        zones: list[tuple[str, pulumi.Input[str]]] = [("private-gpu", az), ("private-second", second_az)]
        if third_az is not None:
            zones.append(("private-third", third_az))
        for key, zone in zones:
            # No load balancer in a Local Zone subnet (NLBs are not offered there).
            lb_tags = {} if (key == "private-gpu" and self.local_zone) else subnet_tags
            subnet = aws.ec2.Subnet(
                f"{name}-{key}",
                vpc_id=vpc.id,
                cidr_block=cidrs[key],
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={**tags(a.tags), "Name": pulumi.Output.concat(spec.stack, "-private-", zone), **lb_tags},
                opts=child(self),
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-{key}-assoc", subnet_id=subnet.id, route_table_id=private_rt.id, opts=child(self)
            )
            private.append(subnet)
        self.vpc_id = vpc.id
        self.node_subnet_cidrs = tuple(cidrs[key] for key, _ in zones)
        # The control plane never gets the Local Zone subnet (EKS refuses it).
        control_plane = private[1:] if self.local_zone else private
        self.private_subnet_ids = pulumi.Output.all(*[s.id for s in control_plane])
        self.gpu_subnet_ids = pulumi.Output.all(private[0].id)
        if net.s3_gateway_endpoint:
            self._create_s3_endpoint(name, vpc.id, pulumi.Output.all(private_rt.id))

    def _second_az(self, gpu_az: str) -> pulumi.Input[str]:
        """Another AZ of the region for the second private subnet (EKS needs two AZs): one that
        also offers the instance type when the offering facts name one, else the first other
        AZ of the region that needs no opt-in."""
        spec = self._args.spec
        offered = [z for z in spec.instance.offered_azs.get(spec.region or "", ()) if z != gpu_az]
        if offered:
            return offered[0]
        zones = aws.get_availability_zones_output(
            region=self._args.region,
            state="available",
            filters=[aws.GetAvailabilityZonesFilterArgs(name="opt-in-status", values=["opt-in-not-required"])],
        )
        # Every commercial region has at least three AZs; the GPU AZ is never picked twice.
        return zones.names.apply(lambda names: [n for n in sorted(names) if n != gpu_az][0])

    def _parent_azs(self) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
        """Two AZs of the parent region (zone type ``availability-zone``, no opt-in) for the EKS
        control plane, system nodes and NAT when the GPU zone is a Local Zone."""
        zones = aws.get_availability_zones_output(
            region=self._args.region,
            state="available",
            filters=[
                aws.GetAvailabilityZonesFilterArgs(name="opt-in-status", values=["opt-in-not-required"]),
                aws.GetAvailabilityZonesFilterArgs(name="zone-type", values=["availability-zone"]),
            ],
        )
        names = zones.names.apply(lambda n: sorted(n))
        return names.apply(lambda n: n[0]), names.apply(lambda n: n[1])

    def _create_s3_endpoint(self, name: str, vpc_id: pulumi.Input[str], route_table_ids: pulumi.Input[list[str]]) -> None:
        a = self._args
        endpoint = aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc_id,
            service_name=f"com.amazonaws.{a.region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=route_table_ids,
            tags=tags(a.tags, f"{a.spec.stack}-s3-gateway"),
            opts=child(self),
        )
        self.s3_endpoint_id = endpoint.id

    # -- security groups ----------------------------------------------------------------------
    def _create_gpu_security_group(self, name: str) -> pulumi.Output[str]:
        a = self._args
        spec, net = a.spec, a.spec.config.network
        port = spec.config.vllm.port
        sg = aws.ec2.SecurityGroup(
            f"{name}-gpu-sg",
            vpc_id=self.vpc_id,
            description=f"kimi-deploy {spec.stack}: GPU nodes; vLLM port {port} from allowed sources only",
            tags=tags(a.tags, f"{spec.stack}-gpu"),
            opts=child(self),
        )
        # Rules are named after their source, not their position: reordering the config list
        # must not replace (and briefly drop) a rule.
        for cidr in net.allowed_cidrs:
            family = {"cidr_ipv6": cidr} if ":" in cidr else {"cidr_ipv4": cidr}
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-gpu-api-cidr-{cidr.replace('/', '_').replace(':', '-')}",
                security_group_id=sg.id,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                description=f"vLLM API from {cidr} (network.allowedCidrs)",
                tags=tags(a.tags),
                opts=child(self),
                **family,
            )
        for group in net.allowed_security_group_ids:
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-gpu-api-sg-{group}",
                security_group_id=sg.id,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                referenced_security_group_id=group,
                description=f"vLLM API from {group} (network.allowedSecurityGroupIds)",
                tags=tags(a.tags),
                opts=child(self),
            )
        if spec.nodes_per_copy > 1:
            # Leader and workers of one copy: torch.distributed rendezvous and NCCL bootstrap.
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-gpu-self",
                security_group_id=sg.id,
                ip_protocol="-1",
                referenced_security_group_id=sg.id,
                description=f"GPU nodes of one model copy (rendezvous port {VLLM_MASTER_PORT}, NCCL)",
                tags=tags(a.tags),
                opts=child(self),
            )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-gpu-egress",
            security_group_id=sg.id,
            ip_protocol="-1",
            cidr_ipv4=ANY_IPV4,
            description="Outbound: S3 (gateway endpoint), image registry and hub (NAT), AWS APIs",
            tags=tags(a.tags),
            opts=child(self),
        )
        return sg.id

    def _create_efa_security_group(self, name: str) -> pulumi.Output[str]:
        a = self._args
        sg = aws.ec2.SecurityGroup(
            f"{name}-efa-sg",
            vpc_id=self.vpc_id,
            description=f"kimi-deploy {a.spec.stack}: EFA, all traffic to and from itself only",
            tags=tags(a.tags, f"{a.spec.stack}-efa"),
            opts=child(self),
        )
        inbound = aws.vpc.SecurityGroupIngressRule(
            f"{name}-efa-in-self",
            security_group_id=sg.id,
            ip_protocol="-1",
            referenced_security_group_id=sg.id,
            description="EFA: all traffic from members",
            tags=tags(a.tags),
            opts=child(self),
        )
        outbound = aws.vpc.SecurityGroupEgressRule(
            f"{name}-efa-out-self",
            security_group_id=sg.id,
            ip_protocol="-1",
            referenced_security_group_id=sg.id,
            description="EFA: all traffic to members",
            tags=tags(a.tags),
            opts=child(self),
        )
        self.efa_security_group_rules = [inbound, outbound]
        return sg.id

    def lustre_security_group(
        self, name: str, client_security_group_ids: list[pulumi.Input[str]]
    ) -> tuple[pulumi.Output[str], list[pulumi.Resource]]:
        """A security group for an FSx for Lustre file system: Lustre ports from the clients and
        from itself (FSx servers talk to each other), nothing else.

        Returns:
            ``(group id, rules)``. FSx validates the group's rules when the file system is
            created (InvalidNetworkSettings), so the file system must depend on ``rules``.
        """
        a = self._args
        sg = aws.ec2.SecurityGroup(
            f"{name}-fsx-sg",
            vpc_id=self.vpc_id,
            description=f"kimi-deploy {a.spec.stack}: FSx for Lustre, Lustre ports from GPU nodes only",
            tags=tags(a.tags, f"{a.spec.stack}-fsx"),
            opts=child(self),
        )
        sources: list[tuple[str, pulumi.Input[str]]] = [("self", sg.id)] + [
            (f"client{i}", g) for i, g in enumerate(client_security_group_ids)
        ]
        rules: list[pulumi.Resource] = []
        for label, source in sources:
            for low, high in LUSTRE_PORTS:
                rules.append(aws.vpc.SecurityGroupIngressRule(
                    f"{name}-fsx-{label}-{low}",
                    security_group_id=sg.id,
                    ip_protocol="tcp",
                    from_port=low,
                    to_port=high,
                    referenced_security_group_id=source,
                    description=f"Lustre {low}-{high} from {label}",
                    tags=tags(a.tags),
                    opts=child(self),
                ))
        rules.append(aws.vpc.SecurityGroupEgressRule(
            f"{name}-fsx-egress",
            security_group_id=sg.id,
            ip_protocol="-1",
            cidr_ipv4=ANY_IPV4,
            description="Outbound: Lustre clients, S3 for the data repository association",
            tags=tags(a.tags),
            opts=child(self),
        ))
        return sg.id, rules
