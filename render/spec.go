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
	Artifacts     []artifactInput   `yaml:"artifacts"`
	Node          string            `yaml:"node" default:"any node the planner picks"`
	NodeSelector  map[string]string `yaml:"nodeSelector"`
	Checks        checksInput       `yaml:"checks"`
	// TerminationGracePeriod: a Duration is never zero once parsed, so
	// it needs no default tag to refuse 0.
	TerminationGracePeriod Duration `yaml:"terminationGracePeriod"`
}

// checksInput are the health checks of a Jail or a Service template
// (docs/spec.md, "Health checks"); a check left out is not run.
type checksInput struct {
	Startup   *checkInput `yaml:"startup"`
	Readiness *checkInput `yaml:"readiness"`
	Liveness  *checkInput `yaml:"liveness"`
}

// checkInput is one check: exactly one of tcp, http and exec, and its
// timing.
type checkInput struct {
	TCP              *tcpCheckInput  `yaml:"tcp"`
	HTTP             *httpCheckInput `yaml:"http"`
	Exec             *execCheckInput `yaml:"exec"`
	Period           Duration        `yaml:"period"`
	Timeout          Duration        `yaml:"timeout"`
	SuccessThreshold int             `yaml:"successThreshold" default:"1"`
	FailureThreshold int             `yaml:"failureThreshold" default:"3"`
}

// A check's port is a pointer because written as 0 (an error) is not the
// same as left out: the Service's port in a template, required in a Jail
// (see checkPort).
type tcpCheckInput struct {
	Port *int `yaml:"port"`
}

type httpCheckInput struct {
	Port   *int        `yaml:"port"`
	Path   string      `yaml:"path" default:"/"`
	Host   string      `yaml:"host" default:"the instance's address"`
	Status statusRange `yaml:"status"`
}

type execCheckInput struct {
	Command []string `yaml:"command"`
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

// artifactInput is one of spec.artifacts (docs/spec.md, "Artifacts"). Mode
// is a pointer because written (an error with archive, and 0 refused) is
// not the same as left out (DefaultArtifactMode, or none for an archive).
type artifactInput struct {
	URL     string    `yaml:"url"`
	SHA256  string    `yaml:"sha256"`
	Path    string    `yaml:"path"`
	Mode    *FileMode `yaml:"mode"`
	Archive string    `yaml:"archive" default:"none: the file is placed as it is"`
}

type serviceDoc struct {
	APIVersion string       `yaml:"apiVersion"`
	Kind       string       `yaml:"kind"`
	Metadata   Metadata     `yaml:"metadata"`
	Spec       serviceInput `yaml:"spec"`
}

type serviceInput struct {
	Replicas *int          `yaml:"replicas"`
	Port     int           `yaml:"port"`
	Strategy strategyInput `yaml:"strategy"`
	Template jailInput     `yaml:"template"`
}

// strategyInput paces a Service's rollouts (docs/spec.md, "Rollouts").
// maxUnavailable and maxSurge are pointers: written as 0 is not the same
// as left out (both written 0 is an error; left out, maxUnavailable is 1).
type strategyInput struct {
	MaxUnavailable   *intOrPercent `yaml:"maxUnavailable"`
	MaxSurge         *intOrPercent `yaml:"maxSurge"`
	MinReadySeconds  int           `yaml:"minReadySeconds"`
	ProgressDeadline Duration      `yaml:"progressDeadline"`
	FailureAction    string        `yaml:"failureAction" default:"pause"`
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
