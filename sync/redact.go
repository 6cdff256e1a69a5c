package sync

import (
	"errors"
	"net/url"
	"regexp"
)

var urlInText = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"']+`)

// RedactURL returns err with the credentials of any URL in its message
// replaced by "redacted", so that an error can be logged or shown safely.
func RedactURL(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := urlInText.ReplaceAllStringFunc(msg, func(s string) string {
		u, perr := url.Parse(s)
		if perr != nil || u.User == nil {
			return s
		}
		u.User = url.User("redacted")
		return u.String()
	})
	if clean == msg {
		return err
	}
	return errors.New(clean)
}
