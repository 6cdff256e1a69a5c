package render

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Position is where something was written: a file relative to the repository
// root and a 1-based line and column. Line 0 means "the file as a whole".
type Position struct {
	File   string `json:"file" yaml:"file"`
	Line   int    `json:"line,omitempty" yaml:"line,omitempty"`
	Column int    `json:"column,omitempty" yaml:"column,omitempty"`
}

func (p Position) String() string {
	switch {
	case p.File == "":
		return ""
	case p.Line == 0:
		return p.File
	default:
		return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Column)
	}
}

// Severity says whether a diagnostic makes the repository invalid.
type Severity string

const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
)

// Diagnostic is one problem found in the repository.
type Diagnostic struct {
	Severity Severity `json:"severity"`
	Pos      Position `json:"position"`
	// Field is the dotted path of the field inside its document, such as
	// spec.resources.memory or spec.volumes[1].mountPath; empty when the
	// problem is not about one field.
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// String formats the diagnostic the way compilers do:
// file:line:col: field.path: message.
func (d Diagnostic) String() string {
	var b strings.Builder
	if p := d.Pos.String(); p != "" {
		b.WriteString(p)
		b.WriteString(": ")
	}
	if d.Field != "" {
		b.WriteString(d.Field)
		b.WriteString(": ")
	}
	b.WriteString(d.Message)
	return b.String()
}

// Diagnostics is a list of problems, errors and warnings mixed.
type Diagnostics []Diagnostic

// Errors returns the diagnostics of severity error.
func (ds Diagnostics) Errors() Diagnostics { return ds.filter(SeverityError) }

// Warnings returns the diagnostics of severity warning.
func (ds Diagnostics) Warnings() Diagnostics { return ds.filter(SeverityWarning) }

func (ds Diagnostics) filter(s Severity) Diagnostics {
	var out Diagnostics
	for _, d := range ds {
		if d.Severity == s {
			out = append(out, d)
		}
	}
	return out
}

// Sort orders diagnostics by file, line, column, field and message, and drops
// exact duplicates, so that output is stable whatever the reading order.
func (ds Diagnostics) Sort() Diagnostics {
	out := slices.Clone(ds)
	slices.SortStableFunc(out, func(a, b Diagnostic) int {
		return cmp.Or(
			cmp.Compare(a.Pos.File, b.Pos.File),
			cmp.Compare(a.Pos.Line, b.Pos.Line),
			cmp.Compare(a.Pos.Column, b.Pos.Column),
			cmp.Compare(a.Field, b.Field),
			cmp.Compare(a.Message, b.Message),
		)
	})
	return slices.Compact(out)
}

// InvalidError is returned when the repository has at least one error. It
// carries every error found, sorted.
type InvalidError struct {
	Diagnostics Diagnostics
}

func (e *InvalidError) Error() string {
	lines := make([]string, 0, len(e.Diagnostics))
	for _, d := range e.Diagnostics {
		lines = append(lines, d.String())
	}
	return strings.Join(lines, "\n")
}

// diagnoser collects diagnostics while a repository is read.
type diagnoser struct {
	diags Diagnostics
	// undecoded holds the fields whose value could not be decoded. Later
	// checks see only the zero value there, and an error about it ("0 is
	// not a TCP port" for port: "8080") would blame the user for something
	// they did not write, so errors at the same position about the same
	// field, or a field inside it (the name of a volume written ~), are
	// dropped.
	undecoded map[fieldAt]bool
}

type fieldAt struct {
	pos   Position
	field string
}

func (c *diagnoser) errorf(pos Position, field, format string, args ...any) {
	for f := field; len(c.undecoded) > 0; {
		if c.undecoded[fieldAt{pos, f}] {
			return
		}
		i := strings.LastIndexAny(f, ".[")
		if i < 0 {
			break
		}
		f = f[:i]
	}
	c.diags = append(c.diags, Diagnostic{Severity: SeverityError, Pos: pos, Field: field, Message: fmt.Sprintf(format, args...)})
}

// decodeErrorf reports a value that could not be decoded, and silences the
// errors that checks of its zero value would add later.
func (c *diagnoser) decodeErrorf(pos Position, field, format string, args ...any) {
	c.errorf(pos, field, format, args...)
	if c.undecoded == nil {
		c.undecoded = map[fieldAt]bool{}
	}
	c.undecoded[fieldAt{pos, field}] = true
}

func (c *diagnoser) warnf(pos Position, field, format string, args ...any) {
	c.diags = append(c.diags, Diagnostic{Severity: SeverityWarning, Pos: pos, Field: field, Message: fmt.Sprintf(format, args...)})
}

// MarshalText writes the position as file:line:col.
func (p Position) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// Format writes the diagnostic for a terminal: errors as String does,
// warnings with "warning: " after the position.
func (d Diagnostic) Format() string {
	if d.Severity != SeverityWarning {
		return d.String()
	}
	w := d
	w.Pos = Position{}
	if p := d.Pos.String(); p != "" {
		return p + ": warning: " + w.String()
	}
	return "warning: " + w.String()
}
