"""basin.gateway"""
