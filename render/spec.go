package render

// The types in this file are the documents as users write them. Field names
// are part of Keel's interface (see docs/spec.md); the decoder is strict, so
// every field a user may write is listed here and nothing else.
//
// A field tagged default:"..." has a default that applies when the field is
// left out (or written empty: key:, ~, null). Written as its type's zero
// (0, "", []) it is an error that names the default: the zero is never
// silently taken as "not set".

// APIVersion is the only apiVersion this version of Keel reads.
const APIVersion = "keel/v1"

// Kinds of document in a cluster repository.
const (
	KindCluster = "Cluster"
	KindNode    = "Node"
	KindJail    = "Jail"
	KindService = "Service"
	KindIngress = "Ingress"
)

// Metadata names a document.
type Metadata struct {
	Name   string            `yaml:"name"`
	Labels map[string]string `yaml:"labels"`
}

type clusterDoc struct {
	APIVersion string       `yaml:"apiVersion"`
	Kind       string       `yaml:"kind"`
	Metadata   Metadata     `yaml:"metadata"`
	Spec       clusterInput `yaml:"spec"`
}

type clusterInput struct {
	PodCIDR         Prefix       `yaml:"podCIDR"`
	ServiceCIDR     Prefix       `yaml:"serviceCIDR"`
	Bridge          string       `yaml:"bridge"`
	Pool            string       `yaml:"pool"`
	LivenessTTL     Duration     `yaml:"livenessTTL"`
	ReportInterval  Duration     `yaml:"reportInterval"`
	ReportRefPrefix string       `yaml:"reportRefPrefix"`
	ReportRepo      string       `yaml:"reportRepo"`
	Suspend         bool         `yaml:"suspend"`
	AllowEmpty      bool         `yaml:"allowEmpty"`
	MinAgentVersion string       `yaml:"minAgentVersion"`
	MaxInstances    int          `yaml:"maxInstances" default:"10000"`
	Gossip          *gossipInput `yaml:"gossip"`
}

type gossipInput struct {
	Port int `yaml:"port"`
}

type nodeDoc struct {
	APIVersion string    `yaml:"apiVersion"`
	Kind       string    `yaml:"kind"`
	Metadata   Metadata  `yaml:"metadata"`
	Spec       nodeInput `yaml:"spec"`
}

type nodeInput struct {
	Address     Addr            `yaml:"address"`
	PodCIDR     Prefix          `yaml:"podCIDR"`
	Capacity    *resourcesInput `yaml:"capacity"`
	Schedulable *bool           `yaml:"schedulable"`
	ReportKey   string          `yaml:"reportKey" default:"none: the node's reports are not signed"`
}

type jailDoc struct {
	APIVersion string    `yaml:"apiVersion"`
	Kind       string    `yaml:"kind"`
	Metadata   Metadata  `yaml:"metadata"`
	Spec       jailInput `yaml:"spec"`
}

// jailInput is a Jail's spec, and also a Service's template (where
// network.address is refused: each replica gets its own).
type jailInput struct {
	Image         string            `yaml:"image"`
	Command       []string          `yaml:"command" default:"/bin/sh /etc/rc"`
	Env           map[string]string `yaml:"env"`
	Network       networkInput      `yaml:"network"`
	Resources     resourcesInput    `yaml:"resources"`
	RestartPolicy string            `yaml:"restartPolicy" default:"Always"`
	Volumes       []volumeInput     `yaml:"volumes"`
	Node          string            `yaml:"node" default:"any node the planner picks"`
	NodeSelector  map[string]string `yaml:"nodeSelector"`
}

type networkInput struct {
	VNet    bool     `yaml:"vnet"`
	Bridge  string   `yaml:"bridge" default:"the Cluster's bridge"`
	Address hostAddr `yaml:"address"`
}

type resourcesInput struct {
	CPU    CPU   `yaml:"cpu"`
	Memory Bytes `yaml:"memory"`
}

type volumeInput struct {
	Name      string `yaml:"name"`
	MountPath string `yaml:"mountPath"`
	Size      Bytes  `yaml:"size"`
}

type serviceDoc struct {
	APIVersion string       `yaml:"apiVersion"`
	Kind       string       `yaml:"kind"`
	Metadata   Metadata     `yaml:"metadata"`
	Spec       serviceInput `yaml:"spec"`
}

type serviceInput struct {
	Replicas *int      `yaml:"replicas"`
	Port     int       `yaml:"port"`
	Template jailInput `yaml:"template"`
}

type ingressDoc struct {
	APIVersion string       `yaml:"apiVersion"`
	Kind       string       `yaml:"kind"`
	Metadata   Metadata     `yaml:"metadata"`
	Spec       ingressInput `yaml:"spec"`
}

type ingressInput struct {
	Host    string       `yaml:"host"`
	Path    string       `yaml:"path" default:"/"`
	Backend backendInput `yaml:"backend"`
	TLS     *tlsInput    `yaml:"tls"`
}

type backendInput struct {
	Service string `yaml:"service"`
	Port    int    `yaml:"port" default:"the Service's port"`
}

type tlsInput struct {
	Email string `yaml:"email"`
}

// header is read first from every document to learn its kind.
type header struct {
	APIVersion string
	Kind       string
}
