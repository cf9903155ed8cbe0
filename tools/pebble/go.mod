// Builds Pebble v2.10.3 (MPL-2.0), Let's Encrypt's small ACME test server,
// and pebble-challtestsrv (its DNS), which the ACME tests obtain
// certificates from. Kept out of seamless's own go.mod.
module github.com/seamless-lb/seamless/tools/pebble

go 1.26

require github.com/letsencrypt/pebble/v2 v2.10.3

require (
	github.com/go-jose/go-jose/v4 v4.1.8 // indirect
	github.com/letsencrypt/challtestsrv v1.4.2 // indirect
	github.com/miekg/dns v1.1.62 // indirect
	golang.org/x/mod v0.24.0 // indirect
	golang.org/x/net v0.55.0 // indirect
	golang.org/x/sync v0.14.0 // indirect
	golang.org/x/sys v0.45.0 // indirect
	golang.org/x/tools v0.33.0 // indirect
)
