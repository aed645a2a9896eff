"""Security: TLS listeners (tls), SASL authentication (sasl), ACL authorization (acl) -- issue 9."""
