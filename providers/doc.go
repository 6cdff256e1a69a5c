// Package providers obtains and shares what the ingress needs from outside
// the cluster: certificates from an ACME CA (providers/acme), the DNS-01
// records that prove a host is ours (providers/dns01), and the encrypted
// copies of each certificate that every ingress node serves
// (providers/certshare). This package holds what they share: a
// certificate bundle and when it is due for renewal.
package providers
