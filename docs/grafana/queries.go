package grafana

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

// Expr is one PromQL expression of the dashboard or of the alert rules.
type Expr struct {
	Where  string // the panel, variable or alert it comes from
	PromQL string // as written, Grafana variables included
}

// DashboardExprs returns the PromQL of a dashboard's JSON: every panel
// target's expr (rows' panels included) and the series selector of every
// query variable written label_values(selector, label). It also returns
// the names of the dashboard's variables.
func DashboardExprs(data []byte) (exprs []Expr, vars []string, err error) {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Name  string          `json:"name"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, nil, fmt.Errorf("read the dashboard: %w", err)
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, t := range p.Targets {
				if t.Expr != "" {
					exprs = append(exprs, Expr{Where: fmt.Sprintf("panel %q target %d", p.Title, i), PromQL: t.Expr})
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
		if v.Type != "query" {
			continue
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var m struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &m); err != nil {
				return nil, nil, fmt.Errorf("variable %s: its query is neither a string nor an object with a query", v.Name)
			}
			q = m.Query
		}
		sel, ok := labelValuesSelector(q)
		if !ok {
			return nil, nil, fmt.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, q)
		}
		exprs = append(exprs, Expr{Where: "variable " + v.Name, PromQL: sel})
	}
	return exprs, vars, nil
}

type panel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

var labelValues = regexp.MustCompile(`^\s*label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$`)

// labelValuesSelector is the series selector of Grafana's
// label_values(selector, label).
func labelValuesSelector(q string) (string, bool) {
	m := labelValues.FindStringSubmatch(q)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// AlertExprs returns the expression of every rule of a Prometheus rules
// file, after checking what promtool would: each rule has an alert or
// record name, its for: is a duration, and its labels and annotations are
// templates that parse.
func AlertExprs(data []byte) ([]Expr, error) {
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Record      string            `yaml:"record"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("read the rules: %w", err)
	}
	var exprs []Expr
	var errs []error
	for _, g := range f.Groups {
		for i, r := range g.Rules {
			name := r.Alert + r.Record
			where := fmt.Sprintf("group %s rule %d (%s)", g.Name, i, name)
			if (r.Alert == "") == (r.Record == "") || r.Expr == "" {
				errs = append(errs, fmt.Errorf("%s: a rule has an expr and one of alert or record", where))
				continue
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					errs = append(errs, fmt.Errorf("%s: for: %w", where, err))
				}
			}
			for k, text := range r.Annotations {
				errs = append(errs, checkTemplate(where+" annotation "+k, text))
			}
			for k, text := range r.Labels {
				errs = append(errs, checkTemplate(where+" label "+k, text))
			}
			exprs = append(exprs, Expr{Where: where, PromQL: r.Expr})
		}
	}
	return exprs, errors.Join(errs...)
}

// checkTemplate parses text as Prometheus does an alert's annotations: a
// text/template with $labels, $externalLabels and $value defined.
func checkTemplate(where, text string) error {
	const defs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$value := .Value}}"
	funcs := template.FuncMap{}
	for _, f := range []string{"humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp", "title", "toUpper", "toLower", "first", "label", "value", "query", "args", "reReplaceAll", "match", "safeHtml", "stripPort", "stripDomain", "graphLink", "tableLink", "sortByLabel", "pathPrefix", "externalURL", "parseDuration", "toTime", "toDuration", "now", "urlUnescape"} {
		funcs[f] = func(...any) any { return nil }
	}
	if _, err := template.New(where).Funcs(funcs).Parse(defs + text); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// builtins are Grafana's interval variables, replaced by a duration.
var builtins = []string{"$__rate_interval", "$__interval", "$__range"}

var variable = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`)

// Parse expands the Grafana variables in e (each of vars, as a regular
// expression matching anything; the interval variables as 5m) and parses
// the result as PromQL. A variable that is not one of vars is an error.
func Parse(e string, vars []string) (parser.Expr, error) {
	for _, b := range builtins {
		e = strings.ReplaceAll(e, b, "5m")
	}
	var unknown []string
	e = variable.ReplaceAllStringFunc(e, func(v string) string {
		name := strings.Trim(v, "${}")
		if !slices.Contains(vars, name) {
			unknown = append(unknown, v)
		}
		return ".*"
	})
	if len(unknown) > 0 {
		return nil, fmt.Errorf("undefined variables %v", unknown)
	}
	return parser.NewParser(parser.Options{}).ParseExpr(e)
}

// MetricNames are the metric names an expression selects, sorted. A
// selector without a metric name (by __name__ regular expression, say)
// is an error: such a query cannot be checked against an exposition.
func MetricNames(e parser.Expr) ([]string, error) {
	var names []string
	var err error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
		}
		if name == "" {
			err = fmt.Errorf("selector %s names no metric", vs)
		} else if !slices.Contains(names, name) {
			names = append(names, name)
		}
		return nil
	})
	slices.Sort(names)
	return names, err
}
