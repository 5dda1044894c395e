"""basin.metrics"""
