// Package grafana builds Keel's Grafana dashboard (keel.json, next to this
// file) with the Grafana Foundation SDK, and reads the PromQL expressions
// back out of the dashboard and of the example alert rules (alerts.yaml)
// so that tests can check them against an agent's /metrics. It is not
// part of the keel binary; `make grafana` regenerates keel.json.
package grafana

//lint:file-ignore SA1019 the SDK marks the classic dashboard model deprecated in favour of schema v2, which Grafana serves only from 12.4 behind feature toggles; the classic JSON imports and provisions in every Grafana in use.

//go:generate go run ./gen keel.json

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"github.com/grafana/grafana-foundation-sdk/go/units"
)

// UID is the dashboard's uid: links to it survive a re-import.
const UID = "keel-agents"

// byNode joins a per-agent series with keel_node_info on the target labels
// Prometheus adds (job, instance): it gives the series the node's name and
// keeps only the nodes the $node variable selects. It assumes the default
// honor_labels: false, under which the metrics' own `instance` label (the
// Keel instance, on keel_instance_info and keel_instance_restarts_total) is
// stored as exported_instance and `instance` is the target's.
const byNode = ` * on(job, instance) group_left(node) keel_node_info{job=~"$job", node=~"$node"}`

// sel is the selector every query starts from.
const sel = `job=~"$job"`

var datasource = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// Dashboard builds the dashboard.
func Dashboard() (dashboard.Dashboard, error) {
	b := dashboard.NewDashboardBuilder("Keel").
		Uid(UID).
		Description("Keel agents: sync and commits per node, instances, Services, proxies, ingress, certificates and host checks (docs/observability.md).").
		Tags([]string{"keel"}).
		Refresh("30s").
		Time("now-3h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("job").Label("Job").
			Datasource(datasource).
			Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(keel_node_info, job)")}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Sort(dashboard.VariableSortAlphabeticalAsc)).
		WithVariable(dashboard.NewQueryVariableBuilder("node").Label("Node").
			Datasource(datasource).
			Query(dashboard.StringOrMap{String: cog.ToPtr(`label_values(keel_node_info{job=~"$job"}, node)`)}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).IncludeAll(true).AllValue(".*"))

	b.WithRow(dashboard.NewRowBuilder("Cluster"))
	for _, p := range overview() {
		b.WithPanel(p)
	}
	b.WithRow(dashboard.NewRowBuilder("Sync and commits"))
	for _, p := range syncPanels() {
		b.WithPanel(p)
	}
	b.WithRow(dashboard.NewRowBuilder("Instances"))
	for _, p := range instancePanels() {
		b.WithPanel(p)
	}
	b.WithRow(dashboard.NewRowBuilder("Services and proxies"))
	for _, p := range servicePanels() {
		b.WithPanel(p)
	}
	b.WithRow(dashboard.NewRowBuilder("Ingress and certificates"))
	for _, p := range ingressPanels() {
		b.WithPanel(p)
	}
	b.WithRow(dashboard.NewRowBuilder("Hosts and agents"))
	for _, p := range hostPanels() {
		b.WithPanel(p)
	}
	d, err := b.Build()
	if err != nil {
		return d, err
	}
	// Grafana keys panel state (links, the panel editor) by ID, and the
	// builders leave every ID 0.
	for i := range d.Panels {
		id := uint32(i + 1)
		if p := d.Panels[i].Panel; p != nil {
			p.Id = &id
		} else if r := d.Panels[i].RowPanel; r != nil {
			r.Id = id
		}
	}
	return d, nil
}

// JSON is the dashboard as checked in: indented, with a final newline.
func JSON() ([]byte, error) {
	d, err := Dashboard()
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode the dashboard: %w", err)
	}
	return append(out, '\n'), nil
}

// query is a range query with a legend.
func query(expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Datasource(datasource).Expr(expr).LegendFormat(legend).Range()
}

// instant is an instant query for a table or a stat.
func instant(expr string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Datasource(datasource).Expr(expr).Instant().Format(prometheus.PromQueryFormatTable)
}

// thresholds are green, then each (value, colour) from that value up.
func thresholds(steps ...any) *dashboard.ThresholdsConfigBuilder {
	ts := []dashboard.Threshold{{Color: "green"}}
	for i := 0; i+1 < len(steps); i += 2 {
		ts = append(ts, dashboard.Threshold{Value: cog.ToPtr(float64(steps[i].(int))), Color: steps[i+1].(string)})
	}
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(ts)
}

// expiryThresholds colour a certificate's time left: red under 7 days,
// orange under 21 (renewal starts at 30 days left, docs/ingress.md).
func expiryThresholds() *dashboard.ThresholdsConfigBuilder {
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps([]dashboard.Threshold{
		{Color: "red"}, {Value: cog.ToPtr(7 * 86400.0), Color: "orange"}, {Value: cog.ToPtr(21 * 86400.0), Color: "green"}})
}

func statPanel(title, desc, expr, unit string, th cog.Builder[dashboard.ThresholdsConfig]) cog.Builder[dashboard.Panel] {
	return stat.NewPanelBuilder().Title(title).Description(desc).Datasource(datasource).
		Height(4).Span(3).Unit(unit).Thresholds(th).
		ColorMode(common.BigValueColorModeBackground).GraphMode(common.BigValueGraphModeNone).
		Orientation(common.VizOrientationAuto).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(prometheus.NewDataqueryBuilder().Datasource(datasource).Expr(expr).Instant())
}

func graph(title, desc, unit string, qs ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Description(desc).Datasource(datasource).
		Height(8).Span(12).Unit(unit).FillOpacity(10).
		Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom).ShowLegend(true))
	for _, q := range qs {
		p.WithTarget(q)
	}
	return p
}

func tablePanel(title, desc string, span uint32, q *prometheus.DataqueryBuilder, hide ...string) *table.PanelBuilder {
	excluded := map[string]any{"Time": true, "__name__": true, "job": true, "instance": true}
	for _, h := range hide {
		excluded[h] = true
	}
	return table.NewPanelBuilder().Title(title).Description(desc).Datasource(datasource).
		Height(8).Span(span).WithTarget(q).
		WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{"excludeByName": excluded}})
}

func overview() []cog.Builder[dashboard.Panel] {
	return []cog.Builder[dashboard.Panel]{
		statPanel("Agents down", "Scrape targets of the job that did not answer their last scrape: the agent is down, or its node is.",
			`count(up{`+sel+`} == 0) or vector(0)`, units.Short, thresholds(1, "red")),
		statPanel("Commits applied", "Distinct commits the nodes apply: 1 when they agree.",
			`count(count by (commit) (keel_commit_info{`+sel+`}))`, units.Short, thresholds(2, "orange")),
		statPanel("Nodes refusing the tip", "Nodes whose newest commit is refused (keel_commit_refused_info).",
			`count(keel_commit_refused_info{`+sel+`}) or vector(0)`, units.Short, thresholds(1, "red")),
		statPanel("Unschedulable instances", "Instances the plan cannot place on any node (the highest count any node reports).",
			`max(keel_instances_unschedulable{`+sel+`})`, units.Short, thresholds(1, "red")),
		statPanel("Instances not running", "Instances crash-looping or failed, all nodes together.",
			`sum(keel_instances{`+sel+`, state=~"crashloop|failed"})`, units.Short, thresholds(1, "red")),
		statPanel("Services short", "Services with fewer endpoints ready than replicas.",
			`count(max by (service) (keel_service_replicas{`+sel+`}) > min by (service) (keel_service_endpoints_ready{`+sel+`})) or vector(0)`, units.Short, thresholds(1, "orange")),
		statPanel("Host problems", "Host prerequisites that do not hold, all nodes and checks together.",
			`sum(keel_node_problem{`+sel+`}) or vector(0)`, units.Short, thresholds(1, "red")),
		statPanel("First certificate expiry", "Time left on the certificate that expires first, of every host on every node that serves one.",
			`min(keel_certificate_expiry_timestamp_seconds{`+sel+`}) - time()`, units.DurationSeconds,
			expiryThresholds()),
	}
}

func syncPanels() []cog.Builder[dashboard.Panel] {
	return []cog.Builder[dashboard.Panel]{
		tablePanel("Nodes", "Each node's agent version and applied commit, and the plan it computed: nodes that hold the same commit and reports compute the same plan ID.", 12,
			instant(`keel_commit_info{`+sel+`}`+` * on(job, instance) group_left(node, version) keel_node_info{job=~"$job", node=~"$node"}`+
				` * on(job, instance) group_left(plan_id) keel_plan_info{`+sel+`}`), "Value"),
		tablePanel("Refused commits", "Nodes whose newest commit is refused, and the kind of refusal (keel node status and the report give the reason in words).", 12,
			instant(`keel_commit_refused_info{`+sel+`}`+byNode), "Value"),
		graph("Time since the last successful fetch", "Per node; it grows while git is unreachable or every fetch fails.", units.Seconds,
			query(`time() - (keel_sync_last_success_timestamp_seconds{`+sel+`}`+byNode+`)`, "{{node}}")),
		graph("Sync duration (p50, p95)", "Time of a successful fetch, per node.", units.Seconds,
			query(`histogram_quantile(0.95, sum by (node, le) (rate(keel_sync_duration_seconds_bucket{`+sel+`}[$__rate_interval])`+byNode+`))`, "{{node}} p95"),
			query(`histogram_quantile(0.5, sum by (node, le) (rate(keel_sync_duration_seconds_bucket{`+sel+`}[$__rate_interval])`+byNode+`))`, "{{node}} p50")),
		graph("Syncs", "Successful fetches and failed git operations per second, per node (failures by reason: fetch, read, publish).", units.Short,
			query(`sum by (node) (rate(keel_sync_duration_seconds_count{`+sel+`}[$__rate_interval])`+byNode+`)`, "{{node}} ok"),
			query(`sum by (node, reason) (rate(keel_sync_errors_total{`+sel+`}[$__rate_interval])`+byNode+`) > 0`, "{{node}} {{reason}} failed")),
		graph("Reports", "Report pushes per second per node, and failed pushes. A node whose reports do not get through is held dead by the others after livenessTTL.", units.Short,
			query(`sum by (node) (rate(keel_report_pushes_total{`+sel+`}[$__rate_interval])`+byNode+`)`, "{{node}} pushed"),
			query(`sum by (node) (rate(keel_report_push_errors_total{`+sel+`}[$__rate_interval])`+byNode+`) > 0`, "{{node}} failed")),
		graph("Nodes alive", "Nodes alive in each node's plan; they should all see the same number.", units.Short,
			query(`keel_nodes_alive{`+sel+`}`+byNode, "{{node}}")),
		graph("Reconcile duration (p95) and errors", "Time of a reconcile pass, per node, and errors (one per failed instance operation).", units.Seconds,
			query(`histogram_quantile(0.95, sum by (node, le) (rate(keel_reconcile_duration_seconds_bucket{`+sel+`}[$__rate_interval])`+byNode+`))`, "{{node}} p95"),
			query(`sum by (node) (rate(keel_reconcile_errors_total{`+sel+`}[$__rate_interval])`+byNode+`) > 0`, "{{node}} errors/s")),
	}
}

func instancePanels() []cog.Builder[dashboard.Panel] {
	return []cog.Builder[dashboard.Panel]{
		graph("Instances by state", "Instances each node holds, by state.", units.Short,
			query(`sum by (node, state) (keel_instances{`+sel+`}`+byNode+`) > 0`, "{{node}} {{state}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)),
		graph("Restarts", "Restarts per instance over the interval: after a crash, or for a rollout.", units.Short,
			query(`sum by (node, exported_instance) (increase(keel_instance_restarts_total{`+sel+`}[$__rate_interval])`+byNode+`) > 0`, "{{node}} {{exported_instance}}")),
		tablePanel("Instances not running", "Instances in a state other than running, with their node and Service.", 12,
			instant(`keel_instance_info{`+sel+`, state!="running"}`+byNode), "Value"),
		graph("Unschedulable, waiting and in flight", "Instances the plan cannot place (cluster wide), stateful instances waiting for another node to stop them, and instance operations running, per node.", units.Short,
			query(`max(keel_instances_unschedulable{`+sel+`})`, "unschedulable"),
			query(`keel_instances_waiting{`+sel+`}`+byNode, "{{node}} waiting"),
			query(`keel_instance_operations{`+sel+`}`+byNode, "{{node}} operations")),
	}
}

func servicePanels() []cog.Builder[dashboard.Panel] {
	return []cog.Builder[dashboard.Panel]{
		graph("Service replicas and endpoints ready", "Replicas each Service asks for, and its endpoints ready (the lowest count any node's plan gives).", units.Short,
			query(`max by (service) (keel_service_replicas{`+sel+`})`, "{{service}} replicas"),
			query(`min by (service) (keel_service_endpoints_ready{`+sel+`})`, "{{service}} ready")),
		graph("Proxy endpoints", "Endpoints each node's proxy relays to, per Service; 0 resets every connection.", units.Short,
			query(`keel_proxy_endpoints{`+sel+`}`+byNode, "{{node}} {{service}}")),
		graph("Proxy connections", "Client connections accepted per second, per Service, all selected nodes together.", units.Short,
			query(`sum by (service) (rate(keel_proxy_connections_total{`+sel+`}[$__rate_interval])`+byNode+`)`, "{{service}}")),
		graph("Proxy errors", "Failed dials to an endpoint, and connections reset at the connection limit, per Service.", units.Short,
			query(`sum by (service) (rate(keel_proxy_dial_errors_total{`+sel+`}[$__rate_interval])`+byNode+`) > 0`, "{{service}} dial errors"),
			query(`sum by (service) (rate(keel_proxy_rejected_total{`+sel+`}[$__rate_interval])`+byNode+`) > 0`, "{{service}} rejected")),
		graph("Proxy active connections", "Client connections open now, per node and Service.", units.Short,
			query(`keel_proxy_active_connections{`+sel+`}`+byNode+` > 0`, "{{node}} {{service}}")),
	}
}

func ingressPanels() []cog.Builder[dashboard.Panel] {
	return []cog.Builder[dashboard.Panel]{
		graph("Ingress requests", "Requests per second by host and status code, all selected nodes together (host \"\" is any Host the route table does not know).", units.RequestsPerSecond,
			query(`sum by (host, code) (rate(keel_ingress_requests_total{`+sel+`}[$__rate_interval])`+byNode+`)`, "{{host}} {{code}}")),
		graph("Ingress errors", "Share of requests answered 5xx, per host.", units.PercentUnit,
			query(`sum by (host) (rate(keel_ingress_requests_total{`+sel+`, code=~"5.."}[$__rate_interval])`+byNode+`)`+
				` / sum by (host) (rate(keel_ingress_requests_total{`+sel+`}[$__rate_interval])`+byNode+`)`, "{{host}}")),
		graph("Ingress latency (p95)", "Time from a request's headers to the end of its answer, per host.", units.Seconds,
			query(`histogram_quantile(0.95, sum by (host, le) (rate(keel_ingress_request_duration_seconds_bucket{`+sel+`}[$__rate_interval])`+byNode+`))`, "{{host}}")),
		graph("Ingress connections", "Client connections open now on each node's ingress.", units.Short,
			query(`keel_ingress_active_connections{`+sel+`}`+byNode, "{{node}}")),
		tablePanel("Certificates", "Time left on the certificate each node serves for each host.", 12,
			instant(`keel_certificate_expiry_timestamp_seconds{`+sel+`}`+byNode+` - time()`)).Unit(units.DurationSeconds).
			Thresholds(expiryThresholds()),
		graph("Certificate orders", "ACME orders per host over the interval, by result.", units.Short,
			query(`sum by (host, result) (increase(keel_certificate_renewals_total{`+sel+`}[$__rate_interval])`+byNode+`) > 0`, "{{host}} {{result}}")),
	}
}

func hostPanels() []cog.Builder[dashboard.Panel] {
	return []cog.Builder[dashboard.Panel]{
		tablePanel("Host problems", "Host prerequisites that do not hold, per node and check (keel node status says how to fix them).", 12,
			instant(`keel_node_problem{`+sel+`}`+byNode+` > 0`)),
		graph("Agent memory", "Resident memory of each agent process (not its instances).", units.BytesIEC,
			query(`process_resident_memory_bytes{`+sel+`}`+byNode, "{{node}}")),
		graph("Agent file descriptors", "Open descriptors of each agent: listeners, proxied connections, git.", units.Short,
			query(`process_open_fds{`+sel+`}`+byNode, "{{node}} open"),
			query(`process_max_fds{`+sel+`}`+byNode, "{{node}} limit")),
		graph("Agent goroutines", "Goroutines of each agent.", units.Short,
			query(`go_goroutines{`+sel+`}`+byNode, "{{node}}")),
	}
}
