package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the agent's Prometheus metrics (docs/metrics.md lists them).
type Metrics struct {
	// NodeInfo is 1 with the node's name and the agent's version: the
	// one series that names the node, for joins on the target labels
	// (docs/observability.md).
	NodeInfo          *prometheus.GaugeVec
	SyncDuration      prometheus.Histogram
	SyncErrors        *prometheus.CounterVec
	SyncLastSuccess   prometheus.Gauge
	Commit            *prometheus.GaugeVec
	CommitRefused     *prometheus.GaugeVec
	ReconcileDuration prometheus.Histogram
	ReconcileErrors   prometheus.Counter
	InstancesWaiting  prometheus.Gauge
	// InstanceOperations are the instance operations in flight.
	InstanceOperations prometheus.Gauge
	Instances          *prometheus.GaugeVec
	InstanceInfo       *prometheus.GaugeVec
	InstanceRestarts   *prometheus.CounterVec
	NodesAlive         prometheus.Gauge
	NodesSettling      prometheus.Gauge
	ReportPushErrors   prometheus.Counter
	ReportPushes       prometheus.Counter
	Plan               *prometheus.GaugeVec
	NodeProblems       *prometheus.GaugeVec
	// Unschedulable counts the instances the plan cannot place, cluster
	// wide; ServiceReplicas and ServiceEndpoints are each Service's
	// replicas and its endpoints in the plan (the replicas that may take
	// traffic).
	Unschedulable    prometheus.Gauge
	ServiceReplicas  *prometheus.GaugeVec
	ServiceEndpoints *prometheus.GaugeVec
	// RolloutPaused is 1 for a Service whose rollout this node's plan
	// holds paused (a replica not ready within progressDeadline), else 0.
	RolloutPaused *prometheus.GaugeVec
	// InstancesDraining counts this node's instances whose stop waits
	// for the other nodes' proxies to stop sending them connections.
	InstancesDraining prometheus.Gauge
	// GossipMembers counts the inventory's nodes this node's gossip ring
	// sees, by state (alive, dead).
	GossipMembers *prometheus.GaugeVec
	// DrainAcks counts the drain acknowledgements over the gossip ring,
	// by event (drainAckEvents).
	DrainAcks *prometheus.CounterVec
}

// NewMetrics registers the agent's metrics, and the Go and process
// collectors, on reg.
func NewMetrics(reg *prometheus.Registry) *Metrics {
	m := &Metrics{
		NodeInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_node_info", Help: "The node this agent runs and the agent's version (value 1).",
		}, []string{"node", "version"}),
		SyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "keel_sync_duration_seconds", Help: "Time to fetch the cluster repository and read its new commit and reports.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		GossipMembers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_gossip_members", Help: "Nodes of the inventory this node's gossip ring has seen, by state (alive: alive or suspected; dead).",
		}, []string{"state"}),
		SyncErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keel_sync_errors_total", Help: "Failed syncs, by reason (fetch, read, publish).",
		}, []string{"reason"}),
		SyncLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keel_sync_last_success_timestamp_seconds", Help: "Unix time of the last successful fetch.",
		}),
		Commit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_commit_info", Help: "The spec commit applied (value 1).",
		}, []string{"commit"}),
		CommitRefused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_commit_refused_info", Help: "The newest commit, when it was refused, and why (value 1).",
		}, []string{"commit", "reason"}),
		ReconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "keel_reconcile_duration_seconds", Help: "Time of one reconcile pass.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60},
		}),
		ReconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keel_reconcile_errors_total", Help: "Errors met by reconcile passes (one per failing instance and pass).",
		}),
		InstancesWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keel_instances_waiting", Help: "Stateful instances placed on this node that wait for another node's report to list them stopped (break before make).",
		}),
		InstanceOperations: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keel_instance_operations", Help: "Instance operations (volumes, start, stop, destroy, limits) running, off the loop, when the last reconcile pass ended.",
		}),
		Instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_instances", Help: "Instances this node holds, by state.",
		}, []string{"state"}),
		InstanceInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_instance_info", Help: "Each instance this node holds (value 1).",
		}, []string{"instance", "service", "state"}),
		InstanceRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keel_instance_restarts_total", Help: "Restarts of each instance on this node.",
		}, []string{"instance"}),
		NodesAlive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keel_nodes_alive", Help: "Nodes alive in this node's plan.",
		}),
		NodesSettling: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keel_nodes_settling", Help: "Nodes alive but settling in this node's plan: they take no instance from another node yet.",
		}),
		ReportPushErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keel_report_push_errors_total", Help: "Failed pushes of this node's report.",
		}),
		ReportPushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keel_report_pushes_total", Help: "Pushes of this node's report.",
		}),
		Plan: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_plan_info", Help: "The plan this node applies (value 1).",
		}, []string{"plan_id"}),
		NodeProblems: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_node_problem", Help: "Host prerequisites that do not hold on this node, by check (0: the check passes).",
		}, []string{"check"}),
		Unschedulable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keel_instances_unschedulable", Help: "Instances of the applied commit that this node's plan cannot place on any node, cluster wide.",
		}),
		ServiceReplicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_service_replicas", Help: "Replicas each Service of the applied commit asks for.",
		}, []string{"service"}),
		ServiceEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_service_endpoints_ready", Help: "Endpoints of each Service in this node's plan: its replicas that run, are ready and may take traffic.",
		}, []string{"service"}),
		RolloutPaused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keel_rollout_paused", Help: "1 while this node's plan holds the Service's rollout paused: a replica started at the new spec was not ready within the strategy's progressDeadline (failureAction pause).",
		}, []string{"service"}),
		InstancesDraining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "keel_instances_draining", Help: "Instances of this node whose stop waits for the other nodes' proxies to stop sending them connections.",
		}),
		DrainAcks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keel_drain_ack_messages_total",
			Help: "Drain acknowledgements over the gossip ring, by event: asked (this node asked a node for its report), answered (sent its own), received (a node's report taken), rejected (one that failed its checks), send_failed.",
		}, []string{"event"}),
	}
	reg.MustRegister(m.NodeInfo, m.SyncDuration, m.SyncErrors, m.SyncLastSuccess, m.Commit, m.CommitRefused,
		m.ReconcileDuration, m.ReconcileErrors, m.InstancesWaiting, m.InstanceOperations, m.Instances, m.InstanceInfo, m.InstanceRestarts,
		m.NodesAlive, m.NodesSettling, m.ReportPushErrors, m.ReportPushes, m.Plan, m.NodeProblems, m.Unschedulable, m.ServiceReplicas, m.ServiceEndpoints, m.RolloutPaused, m.InstancesDraining, m.GossipMembers, m.DrainAcks,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"fetch", "read", "publish"} {
		m.SyncErrors.WithLabelValues(r)
	}
	return m
}
